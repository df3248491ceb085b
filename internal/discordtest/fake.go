// Package discordtest is an in-test fake of Discord's REST API and gateway:
// enough of both for klbr-discord's tests (gateway hello, identify, resume,
// dispatch, close codes; message create with nonce and enforce_nonce,
// history, reactions; failures on demand). It is a test fixture, never a
// code path the product takes.
package discordtest

import (
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/http/httptest"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/gorilla/websocket"
)

// Sent is a message the fake accepted.
type Sent struct {
	ID        string
	ChannelID string
	Content   string
	Nonce     string
	ReplyTo   string
	At        time.Time
	// Components are the message's components (buttons), as sent.
	Components json.RawMessage
	Files      []File // uploaded with it (multipart/form-data)
}

// Fake is a running fake Discord.
type Fake struct {
	BotID string
	srv   *httptest.Server

	// OnSend, if set, decides each message create before it is recorded:
	// status 0 accepts; another status answers with it (429 with retryAfter).
	// It may block (to hold a send between acceptance and answer, see AfterAccept).
	OnSend func(channel, nonce string) (status int, retryAfter float64)
	// AfterAccept, if set, runs after a send was recorded and before it is
	// answered: a test kills the transport here. A non-zero status answers
	// the accepted send with that error (a 500 after the fact).
	AfterAccept func(Sent) int
	// HistoryNonces makes history report each message's nonce. Discord's
	// message history does not; its gateway echo of a new message does.
	HistoryNonces bool
	// OnCDN, if set, runs before the CDN answers a request for an
	// attachment: it may block (a link that never answers) until the
	// request's context ends.
	OnCDN func(*http.Request)
	// RefreshTTL is how long links refresh-urls makes are valid (0: 24 h;
	// negative: expired at once, a refresh that does not help).
	RefreshTTL time.Duration

	mu        sync.Mutex // guards the fields below
	conns     map[*websocket.Conn]bool
	cur       *websocket.Conn
	seq       int64
	sessions  int // identifies
	resumes   int
	events    [][]byte // dispatched frames, for resume replay
	sent      []Sent
	posted    map[string][]map[string]any // MESSAGE_CREATE data dispatched, by channel: the channels' history
	reactions []string
	// deferEchoes keeps the gateway echoes of our own new messages in
	// deferred until ReleaseEchoes: the gateway lagging behind REST.
	deferEchoes bool
	deferred    []map[string]any
	nextID      int64
	tokens      []string
	cdn         cdn
	// deaf is a connection that acknowledges heartbeats and delivers no
	// dispatch (see SetDeaf).
	deaf *websocket.Conn
	// unreachable refuses gateway connections (see SetUnreachable);
	// expired refuses the next resume (see Disconnect).
	unreachable, expired bool
	threads              map[string]*thread // by id (see CreateThread)
	guilds               []string           // READY's guilds (see AddGuild)
	reqs                 reqState
	ix                   ixState // DM channels and interactions (see Press)
}

// New starts a fake; Close it.
func New(botID string) *Fake {
	f := &Fake{BotID: botID, conns: map[*websocket.Conn]bool{}, nextID: 900000000000000000, posted: map[string][]map[string]any{},
		threads: map[string]*thread{}, reqs: reqState{counts: map[string]int{}, buckets: map[string]*bucket{}},
		ix:  ixState{dms: map[string]string{}, byID: map[string]*Interaction{}},
		cdn: cdn{files: map[string][]byte{}, generated: map[string]int64{}, fetches: map[string]int{}}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/v9/gateway/", f.gateway) // discordgo asks with a trailing slash
	mux.HandleFunc("GET /api/v9/gateway", f.gateway)
	mux.HandleFunc("GET /gw", f.ws)
	mux.HandleFunc("GET /gw/", f.ws) // the gateway URL gets a trailing slash from discordgo
	mux.HandleFunc("POST /api/v9/channels/{ch}/messages", f.create)
	mux.HandleFunc("GET /api/v9/channels/{ch}/messages", f.history)
	mux.HandleFunc("PUT /api/v9/channels/{ch}/messages/{msg}/reactions/{emoji}/@me", f.react)
	mux.HandleFunc("POST /api/v9/attachments/refresh-urls", f.refreshURLs)
	mux.HandleFunc("GET /attachments/", f.serveCDN)
	mux.HandleFunc("PUT /api/v9/channels/{ch}/thread-members/@me", f.joinThread)
	mux.HandleFunc("GET /api/v9/guilds/{guild}/threads/active", f.activeThreads)
	mux.HandleFunc("POST /api/v9/users/@me/channels", f.openDM)
	mux.HandleFunc("POST /api/v9/interactions/{id}/{token}/callback", f.interactionCallback)
	mux.HandleFunc("PATCH /api/v9/webhooks/{app}/{token}/messages/@original", f.editOriginal)
	f.srv = httptest.NewServer(f.requests(mux))
	return f
}

// APIBase is the api_base klbr-discord is configured with.
func (f *Fake) APIBase() string { return f.srv.URL + "/api/v9" }

// Close stops the fake.
func (f *Fake) Close() {
	f.mu.Lock()
	for c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
	f.srv.Close()
}

func (f *Fake) gateway(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.tokens = append(f.tokens, r.Header.Get("Authorization"))
	f.mu.Unlock()
	json.NewEncoder(w).Encode(map[string]string{"url": "ws" + strings.TrimPrefix(f.srv.URL, "http") + "/gw"})
}

var upgrader = websocket.Upgrader{}

func (f *Fake) ws(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	down := f.unreachable
	f.mu.Unlock()
	if down {
		http.Error(w, "upstream connect error", http.StatusServiceUnavailable)
		return
	}
	c, err := upgrader.Upgrade(w, r, nil)
	if err != nil {
		return
	}
	f.mu.Lock()
	f.conns[c] = true
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		delete(f.conns, c)
		if f.cur == c {
			f.cur = nil
		}
		f.mu.Unlock()
		c.Close()
	}()
	f.mu.Lock()
	err = c.WriteJSON(map[string]any{"op": 10, "d": map[string]any{"heartbeat_interval": 1000}})
	f.mu.Unlock()
	if err != nil {
		return
	}
	for {
		var fr struct {
			Op int             `json:"op"`
			D  json.RawMessage `json:"d"`
		}
		if err := c.ReadJSON(&fr); err != nil {
			return
		}
		f.mu.Lock()
		switch fr.Op {
		case 1:
			c.WriteJSON(map[string]any{"op": 11})
		case 2:
			f.expired = false
			f.sessions++
			f.cur = c
			f.seq++
			c.WriteJSON(map[string]any{"op": 0, "t": "READY", "s": f.seq, "d": map[string]any{
				"session_id": fmt.Sprintf("s%d", f.sessions), "resume_gateway_url": "ws" + strings.TrimPrefix(f.srv.URL, "http") + "/gw",
				"user": map[string]any{"id": f.BotID, "username": "klbr", "bot": true}, "guilds": f.readyGuildsLocked(),
				"application": map[string]any{"id": f.BotID, "flags": 0}}})
		case 6:
			var rs struct {
				Seq int64 `json:"seq"`
			}
			json.Unmarshal(fr.D, &rs)
			if f.expired {
				// Discord no longer has the session: op 9, not resumable;
				// its events are gone.
				f.events = nil
				c.WriteJSON(map[string]any{"op": 9, "d": false})
				break
			}
			f.resumes++
			f.cur = c
			// Replay what the client missed, as Discord does.
			for _, ev := range f.events {
				var e struct {
					S int64 `json:"s"`
				}
				json.Unmarshal(ev, &e)
				if e.S > rs.Seq {
					c.WriteMessage(websocket.TextMessage, ev)
				}
			}
			f.seq++
			c.WriteJSON(map[string]any{"op": 0, "t": "RESUMED", "s": f.seq, "d": map[string]any{}})
		}
		f.mu.Unlock()
	}
}

// Dispatch sends a gateway event to the connected client (and keeps it for a
// resume's replay). It reports whether a client was connected.
func (f *Fake) Dispatch(event string, data any) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if m, ok := data.(map[string]any); ok && event == "MESSAGE_CREATE" {
		if ch, ok := m["channel_id"].(string); ok {
			if a, ok := m["author"].(map[string]any); !ok || a["id"] != f.BotID {
				f.posted[ch] = append(f.posted[ch], m) // our own are in sent
			}
		}
	}
	f.seq++
	b, _ := json.Marshal(map[string]any{"op": 0, "t": event, "s": f.seq, "d": data})
	if f.expired {
		return false // the session is gone: nobody receives it, nor a resume
	}
	if !f.subscribedLocked(event, data) {
		return false // a thread the bot is not a member of: nothing for it
	}
	if f.cur != nil && f.cur == f.deaf {
		return true // the session thinks it delivered it; the client never sees it, nor a resume's replay
	}
	f.events = append(f.events, b)
	if f.cur == nil {
		return false
	}
	return f.cur.WriteMessage(websocket.TextMessage, b) == nil
}

// SetDeferEchoes holds back the gateway echoes of our own new messages
// (true) until ReleaseEchoes: the gateway lagging behind REST, as it can.
func (f *Fake) SetDeferEchoes(on bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.deferEchoes = on
}

// ReleaseEchoes dispatches the echoes held back, in order.
func (f *Fake) ReleaseEchoes() {
	f.mu.Lock()
	d := f.deferred
	f.deferred = nil
	f.mu.Unlock()
	for _, m := range d {
		f.Dispatch("MESSAGE_CREATE", m)
	}
}

// DispatchRaw sends raw bytes as a gateway frame.
func (f *Fake) DispatchRaw(b []byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.cur != nil {
		f.cur.WriteMessage(websocket.TextMessage, b)
	}
}

// InvalidateSession sends op 9 (invalid session, not resumable): the client
// must identify anew, and events meanwhile may be lost.
func (f *Fake) InvalidateSession() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.cur != nil {
		f.cur.WriteJSON(map[string]any{"op": 9, "d": false})
		f.events = nil // a new session replays nothing
	}
}

// CloseGateway closes the current connection with a close code.
func (f *Fake) CloseGateway(code int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.cur != nil {
		f.cur.WriteMessage(websocket.CloseMessage, websocket.FormatCloseMessage(code, "fake"))
		f.cur.Close()
		f.cur = nil
	}
}

// Disconnect drops the current connection without a close frame (the
// network failed). With expire, the session expires meanwhile, as Discord's
// do when a client stays away: events dispatched from now on are kept for
// nobody, and the next resume is answered op 9 (invalid session, not
// resumable), so the client identifies anew and never hears of them.
func (f *Fake) Disconnect(expire bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if expire {
		f.expired = true
		f.events = nil
	}
	if f.cur != nil {
		f.cur.Close()
		f.cur = nil
	}
}

// SetUnreachable makes the gateway refuse connections (true: 503 at the
// WebSocket upgrade) until SetUnreachable(false): an outage between the
// client and Discord. REST answers meanwhile.
func (f *Fake) SetUnreachable(on bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.unreachable = on
}

// Connected reports whether a client identified or resumed and is connected.
func (f *Fake) Connected() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cur != nil
}

// Counts: identifies and resumes seen.
func (f *Fake) Counts() (sessions, resumes int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.sessions, f.resumes
}

// Sent returns the messages accepted so far.
func (f *Fake) Sent() []Sent {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]Sent(nil), f.sent...)
}

// Reactions returns the reactions added, as "channel/message/emoji".
func (f *Fake) Reactions() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.reactions...)
}

// Authorizations returns the Authorization headers seen.
func (f *Fake) Authorizations() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.tokens...)
}

// Message builds a MESSAGE_CREATE payload.
func Message(id, channel, guild, author, content string) map[string]any {
	m := map[string]any{"id": id, "channel_id": channel, "author": map[string]any{"id": author, "username": "user" + author},
		"content": content, "timestamp": time.Now().UTC().Format(time.RFC3339Nano), "type": 0, "mentions": []any{}}
	if guild != "" {
		m["guild_id"] = guild
	}
	return m
}

func (f *Fake) create(w http.ResponseWriter, r *http.Request) {
	ch := r.PathValue("ch")
	var body struct {
		Content          string `json:"content"`
		Nonce            string `json:"nonce"`
		EnforceNonce     bool   `json:"enforce_nonce"`
		MessageReference *struct {
			MessageID string `json:"message_id"`
		} `json:"message_reference"`
		Components json.RawMessage `json:"components"`
	}
	var files []File
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt == "multipart/form-data" {
		payload, fs, refusal := readMultipart(r)
		if refusal != nil {
			refusal(w)
			return
		}
		if err := json.Unmarshal(payload, &body); err != nil {
			http.Error(w, `{"message":"bad json","code":50109}`, 400)
			return
		}
		files = fs
	} else {
		b, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if err := json.Unmarshal(b, &body); err != nil {
			http.Error(w, `{"message":"bad json","code":50109}`, 400)
			return
		}
	}
	// Discord counts content in Unicode code points (its API is Python 3)
	// and refuses a message over 2,000 of them, or an empty one, as an
	// invalid form body.
	if n := utf8.RuneCountInString(body.Content); n > MaxContentChars {
		formError(w, "content", "BASE_TYPE_MAX_LENGTH", fmt.Sprintf("Must be %d or fewer in length.", MaxContentChars))
		return
	}
	if body.Content == "" && len(files) == 0 {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(400)
		io.WriteString(w, `{"message":"Cannot send an empty message","code":50006}`)
		return
	}
	if f.OnSend != nil {
		if st, ra := f.OnSend(ch, body.Nonce); st != 0 {
			w.Header().Set("Content-Type", "application/json")
			if st == 429 {
				w.Header().Set("Retry-After", strconv.FormatFloat(ra, 'f', -1, 64))
				w.WriteHeader(429)
				fmt.Fprintf(w, `{"message":"You are being rate limited.","retry_after":%g,"global":false}`, ra)
				return
			}
			w.WriteHeader(st)
			fmt.Fprintf(w, `{"message":"%s","code":0}`, http.StatusText(st))
			return
		}
	}
	f.mu.Lock()
	var s Sent
	found := false
	if body.EnforceNonce && body.Nonce != "" {
		for _, old := range f.sent {
			if old.Nonce == body.Nonce && old.ChannelID == ch {
				s, found = old, true
			}
		}
	}
	if !found {
		f.nextID++
		s = Sent{ID: strconv.FormatInt(f.nextID, 10), ChannelID: ch, Content: body.Content, Nonce: body.Nonce, At: time.Now(), Files: files,
			Components: body.Components}
		if body.MessageReference != nil {
			s.ReplyTo = body.MessageReference.MessageID
		}
		f.sent = append(f.sent, s)
	}
	f.mu.Unlock()
	status := 0
	if f.AfterAccept != nil && !found {
		status = f.AfterAccept(s)
	}
	if !found {
		// Discord echoes a new message, with its nonce, on the gateway.
		f.mu.Lock()
		deferEcho := f.deferEchoes
		if deferEcho {
			f.deferred = append(f.deferred, f.wire(s, true))
		}
		f.mu.Unlock()
		if !deferEcho {
			f.Dispatch("MESSAGE_CREATE", f.wire(s, true))
		}
	}
	w.Header().Set("Content-Type", "application/json")
	if status != 0 {
		w.WriteHeader(status)
		fmt.Fprintf(w, `{"message":"%s","code":0}`, http.StatusText(status))
		return
	}
	json.NewEncoder(w).Encode(f.wire(s, true))
}

// MaxContentChars is Discord's limit on a bot message's content, in code points.
const MaxContentChars = 2000

// formError answers as Discord does for an invalid form body (50035).
func formError(w http.ResponseWriter, field, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(400)
	json.NewEncoder(w).Encode(map[string]any{"code": 50035, "message": "Invalid Form Body",
		"errors": map[string]any{field: map[string]any{"_errors": []any{map[string]any{"code": code, "message": msg}}}}})
}

func (f *Fake) wire(s Sent, nonce bool) map[string]any {
	m := map[string]any{"id": s.ID, "channel_id": s.ChannelID, "content": s.Content,
		"author": map[string]any{"id": f.BotID, "username": "klbr", "bot": true}, "timestamp": s.At.UTC().Format(time.RFC3339Nano), "type": 0}
	if nonce {
		m["nonce"] = s.Nonce
	}
	if s.ReplyTo != "" {
		m["message_reference"] = map[string]any{"message_id": s.ReplyTo}
		m["type"] = 19
	}
	if len(s.Components) > 0 {
		m["components"] = s.Components
	}
	atts := []any{}
	for i, fl := range s.Files {
		atts = append(atts, map[string]any{"id": s.ID + strconv.Itoa(i), "filename": fl.Name, "size": len(fl.Data), "content_type": fl.ContentType})
	}
	m["attachments"] = atts
	return m
}

func (f *Fake) history(w http.ResponseWriter, r *http.Request) {
	ch := r.PathValue("ch")
	q := r.URL.Query()
	limit, _ := strconv.Atoi(q.Get("limit"))
	if limit <= 0 || limit > 100 {
		limit = 50
	}
	before, after := q.Get("before"), q.Get("after")
	f.mu.Lock()
	var all []map[string]any
	for _, s := range f.sent {
		if s.ChannelID == ch {
			all = append(all, f.wire(s, f.HistoryNonces))
		}
	}
	for _, m := range f.posted[ch] {
		c := map[string]any{}
		for k, v := range m {
			if k != "guild_id" { // Discord's history leaves it out
				c[k] = v
			}
		}
		all = append(all, c)
	}
	f.mu.Unlock()
	id := func(m map[string]any) string { s, _ := m["id"].(string); return s }
	less := func(a, b string) bool { return len(a) < len(b) || len(a) == len(b) && a < b }
	sort.Slice(all, func(i, j int) bool { return less(id(all[j]), id(all[i])) }) // newest first, as Discord answers
	out := []map[string]any{}
	if after != "" {
		// The oldest messages after the id, still answered newest first.
		var newer []map[string]any
		for i := len(all) - 1; i >= 0 && len(newer) < limit; i-- {
			if less(after, id(all[i])) {
				newer = append(newer, all[i])
			}
		}
		for i := len(newer) - 1; i >= 0; i-- {
			out = append(out, newer[i])
		}
	} else {
		for _, m := range all {
			if len(out) < limit && (before == "" || less(id(m), before)) {
				out = append(out, m)
			}
		}
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(out)
}

func (f *Fake) react(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.reactions = append(f.reactions, r.PathValue("ch")+"/"+r.PathValue("msg")+"/"+r.PathValue("emoji"))
	f.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}
