package web

import (
	"bytes"
	"context"
	"crypto/sha256"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"html"
	"io"
	"io/fs"
	"iter"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/klbr-dev/klbr/internal/admission"
	"github.com/klbr-dev/klbr/internal/api"
	"github.com/klbr-dev/klbr/internal/artifacts"
	"github.com/klbr-dev/klbr/internal/behavior"
	"github.com/klbr-dev/klbr/internal/history"
	"github.com/klbr-dev/klbr/internal/httpguard"
	"github.com/klbr-dev/klbr/internal/live"
	"github.com/klbr-dev/klbr/internal/session"
	"github.com/klbr-dev/klbr/internal/store"
)

//go:embed ui
var uiFiles embed.FS

// Daemon is what the browser asks of the process it runs in: the daemon
// already implements it for the operator API (localapi.Daemon).
type Daemon interface {
	// Status reports the daemon's state (GET /v2/status).
	Status(ctx context.Context) (api.Status, error)
	// Shutdown asks the daemon to drain (stop false) or stop and exit; it
	// returns at once.
	Shutdown(stop bool)
	// Closing is closed when the daemon begins to shut down; sockets end then.
	Closing() <-chan struct{}
}

// Browser is what the browser client needs. Store, Admit, Daemon and Token
// are required; a control whose part is nil is answered "unavailable".
type Browser struct {
	Store    *store.Store
	Admit    *admission.Admitter // operator inputs enter through admission.DoorBrowser
	Sessions *session.Manager    // session_drain, session_stop, session_start
	Daemon   Daemon
	Token    string // the operator token (setup.ReadToken(setup.TokenFile(dataDir))); Server.RotateToken replaces it
	// CookieMaxAge is how long the login cookie lasts (0: DefaultCookieMaxAge).
	CookieMaxAge time.Duration

	// Optional parts (leave nil, not a typed nil, when absent).
	Workbench Workbench          // reset
	Jobs      Jobs               // job_cancel
	Behavior  Behavior           // activate, rollback, edit_soul
	Releases  *behavior.Releases // activate, edit_soul and GET /v2/soul
	Artifacts *artifacts.Store   // GET /v2/artifacts/{sha256}
	Deltas    *live.Hub          // token deltas of model steps, sent as "delta" messages
	History   *history.Reader    // GET /v2/history (search) and /v2/history/{ref}
	// Compact compacts a session's context now (the operator API's
	// compact): compact.
	Compact func(ctx context.Context, session string) (api.Compacted, error)
	// Spend reads the spend ledger and sets the operator's caps (the
	// operator API's: GET /v2/spend, spend_cap).
	Spend Spend
	// TraceURL is [telemetry] trace_url: the page links an attempt's trace
	// id there ({trace_id} replaced); "" shows the id as text.
	TraceURL string
}

// browser is the configured client.
type browser struct {
	Browser
	tokenMu  sync.RWMutex
	tokenSum [sha256.Size]byte
	rotated  chan struct{} // closed when tokenSum is replaced: sockets of the old token end
	log      *slog.Logger
	ui       http.Handler

	writeTimeout time.Duration // one message to one client
	helloTimeout time.Duration

	slowDrops atomic.Int64 // clients disconnected for being too slow

	refusedMu      sync.Mutex // guards refusedNext and refusedSkipped (logRefused)
	refusedNext    time.Time  // no "refused" line before then
	refusedSkipped int        // refusals not logged since the last line
}

// WithBrowser serves the browser client: the page at /, its assets under
// /ui/, GET /v2/status and /v2/ws, all behind the operator token.
func (s *Server) WithBrowser(b Browser) (*Server, error) {
	switch {
	case b.Store == nil || b.Admit == nil || b.Daemon == nil:
		return nil, errors.New("web: the browser needs the store, the admitter and the daemon")
	case len(b.Token) < 32:
		return nil, errors.New("web: the operator token is missing or too short")
	}
	sub, err := fs.Sub(uiFiles, "ui")
	if err != nil {
		return nil, err
	}
	s.browser = &browser{
		Browser: b, tokenSum: sha256.Sum256([]byte(b.Token)), rotated: make(chan struct{}), log: s.log,
		ui:           http.StripPrefix("/ui/", http.FileServerFS(sub)),
		writeTimeout: 10 * time.Second, helloTimeout: 10 * time.Second,
	}
	return s, nil
}

func (b *browser) routes(mux *http.ServeMux) {
	mux.HandleFunc("GET /{$}", b.guardPage(http.StatusUnauthorized, true, b.handlePage))
	mux.HandleFunc("GET /ui/", b.guard(http.StatusUnauthorized, b.handleAsset))
	mux.HandleFunc("GET /v2/status", b.guard(http.StatusUnauthorized, b.handleStatus))
	mux.HandleFunc("GET /v2/soul", b.guard(http.StatusUnauthorized, b.handleSoul))
	mux.HandleFunc("GET /v2/artifacts/{sha256}", b.guard(http.StatusUnauthorized, b.handleArtifact))
	mux.HandleFunc("GET /v2/ws", b.guard(http.StatusForbidden, b.handleWS))
	b.panelRoutes(mux)
	mux.HandleFunc("/", b.guard(http.StatusUnauthorized, http.NotFound))
}

func secureHeaders(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'self'; connect-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; frame-ancestors 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
}

func (b *browser) handlePage(w http.ResponseWriter, r *http.Request) {
	page, err := uiFiles.ReadFile("ui/index.html")
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	if b.TraceURL != "" {
		page = bytes.Replace(page, []byte(`<meta name="klbr-trace-url" content="">`),
			[]byte(`<meta name="klbr-trace-url" content="`+html.EscapeString(b.TraceURL)+`">`), 1)
	}
	secureHeaders(w)
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Write(page)
}

func (b *browser) handleAsset(w http.ResponseWriter, r *http.Request) {
	secureHeaders(w)
	b.ui.ServeHTTP(w, r)
}

func (b *browser) handleStatus(w http.ResponseWriter, r *http.Request) {
	st, err := b.Daemon.Status(r.Context())
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	if err != nil {
		w.WriteHeader(http.StatusInternalServerError)
		json.NewEncoder(w).Encode(map[string]string{"error": err.Error()})
		return
	}
	json.NewEncoder(w).Encode(st)
}

func (b *browser) handleWS(w http.ResponseWriter, r *http.Request) {
	if !originOK(r) {
		b.refuse(w, r, http.StatusForbidden, "foreign Origin "+r.Header.Get("Origin"))
		return
	}
	// The origin was checked above, more strictly than Accept would. A frame header
	// that declares more than the read limit ends the socket at once (LimitFrames); the
	// read limit then bounds a message made of many frames.
	conn, err := websocket.Accept(httpguard.LimitFrames(w, readLimit), r, &websocket.AcceptOptions{InsecureSkipVerify: true})
	if err != nil {
		b.log.Warn("browser: websocket accept", "error", err)
		return
	}
	conn.SetReadLimit(readLimit)
	c := &client{b: b, conn: conn, queue: make(chan []byte, SendQueue), sent: make(chan struct{}, 1),
		done: make(chan struct{}), deltaReady: make(chan struct{}, 1)}
	c.serve(r.Context())
}

// client is one socket.
type client struct {
	b       *browser
	conn    *websocket.Conn
	queue   chan []byte   // bounded; full means the client is too slow
	dropped atomic.Bool   // set when the client is dropped for being slow
	sent    chan struct{} // coalescing: the writer sent a message

	// Deltas wait apart from queue (deltas.go): coalesced, bounded, written
	// only when nothing else is queued, and dropped first when the client
	// falls behind. deltaMu guards deltas.
	deltaMu    sync.Mutex
	deltas     deltaQueue
	deltaReady chan struct{} // coalescing: deltas are pending

	closeOnce   sync.Once
	done        chan struct{} // closed by close: everything winds down
	closeCode   websocket.StatusCode
	closeReason string
}

// readLimit is the socket's bound on a client message and on each frame's declared
// length; readFrame enforces MaxClientFrame itself.
const readLimit = MaxClientFrame + 16

// errTooLarge is a client frame over MaxClientFrame.
var errTooLarge = errors.New("client frame too large")

// readFrame reads one text message of at most MaxClientFrame bytes.
func (c *client) readFrame(ctx context.Context) ([]byte, error) {
	typ, rd, err := c.conn.Reader(ctx)
	if err != nil {
		return nil, err
	}
	b, err := io.ReadAll(io.LimitReader(rd, MaxClientFrame+1))
	if err != nil {
		return nil, err
	}
	if len(b) > MaxClientFrame {
		return nil, errTooLarge
	}
	if typ != websocket.MessageText {
		return nil, fmt.Errorf("%w: binary frame", ErrBadMessage)
	}
	return b, nil
}

// close asks for the socket to end with a status and reason; serve sends
// the close frame once the stream has stopped. The first call wins.
func (c *client) close(code websocket.StatusCode, reason string) {
	c.closeOnce.Do(func() {
		c.closeCode, c.closeReason = code, reason
		close(c.done)
	})
}

func (c *client) serve(ctx context.Context) {
	out := c.b.signedOut() // the token this socket was opened with
	defer c.conn.CloseNow()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	hctx, hcancel := context.WithTimeout(ctx, c.b.helloTimeout)
	raw, err := c.readFrame(hctx)
	hcancel()
	if err != nil {
		c.readFailed(err)
		c.conn.Close(c.closeCode, c.closeReason)
		return
	}
	hello, err := DecodeClientMessage(raw)
	if err == nil && hello.Type != MsgHello {
		err = fmt.Errorf("%w: the first message must be hello", ErrBadMessage)
	}
	if err != nil {
		c.conn.Close(websocket.StatusPolicyViolation, truncate(err.Error()))
		return
	}
	if _, err := c.b.Store.Session(ctx, hello.Session); err != nil {
		c.conn.Close(websocket.StatusPolicyViolation, truncate(err.Error()))
		return
	}

	var wg sync.WaitGroup
	if c.b.Deltas != nil {
		// Subscribed before the replay: a step that streams meanwhile
		// shows its preview once the replay has gone out.
		sub, unsubscribe := c.b.Deltas.Subscribe(hello.Session)
		defer unsubscribe()
		wg.Go(func() { c.forwardDeltas(ctx, sub) })
	}
	wg.Go(func() { c.writeLoop(ctx) })
	wg.Go(func() { c.readLoop(ctx, hello.Session) })
	wg.Go(func() {
		select {
		case <-out:
			c.close(websocket.StatusPolicyViolation, "signed out: the operator token was rotated")
		case <-c.done:
		case <-ctx.Done():
		}
	})
	c.stream(ctx, hello.Session, hello.Cursor, hello.Tail)
	select {
	case <-c.done:
		if c.dropped.Load() {
			// A client too slow to take its messages is too slow for a close
			// handshake too (the close frame would queue behind them): cut it.
			c.conn.CloseNow()
		} else {
			c.conn.Close(c.closeCode, c.closeReason) // bounded: the library waits 5 s at most
		}
	default:
	}
	cancel()
	wg.Wait()
}

func (c *client) readFailed(err error) {
	switch {
	case errors.Is(err, httpguard.ErrFrameTooLarge):
		c.b.log.Warn("browser: a client frame declared a payload over the limit; the socket was closed", "error", err)
		c.close(websocket.StatusPolicyViolation, "client frame over the limit")
	case errors.Is(err, errTooLarge):
		c.close(websocket.StatusPolicyViolation, "client frame over the limit")
	case errors.Is(err, ErrBadMessage):
		c.close(websocket.StatusPolicyViolation, truncate(err.Error()))
	default:
		c.close(websocket.StatusNormalClosure, "")
	}
}

// stream replays the records after cursor in pages, then streams live
// records as they commit, until the client or the daemon goes.
func (c *client) stream(ctx context.Context, id string, cursor int64, tail int) {
	wake, cancel := c.b.Store.Watch(id) // before the first read: no commit is missed
	defer cancel()
	if cursor > 0 {
		// A cursor past the last record (a restored or another data directory) would
		// otherwise see nothing until new records pass it: say so and send a fresh snapshot.
		last, err := c.b.Store.LastSeq(ctx, id)
		if err == nil && cursor > last {
			msg := fmt.Sprintf("cursor %d is past the last record (%d) of session %s: here is a fresh snapshot", cursor, last, id)
			if !c.send(errorMsg{Type: MsgError, Code: CodeCursorPastEnd, Message: msg}) {
				return
			}
			cursor = 0
			if tail == 0 {
				tail = SnapshotTail
			}
		}
	}
	if cursor == 0 && tail > 0 {
		// A bounded snapshot: the last tail records, and how many precede them.
		from, earlier, err := c.b.Store.TailCursor(ctx, id, tail)
		if err != nil {
			c.b.log.Warn("browser: read records", "session", id, "error", err)
			c.close(websocket.StatusInternalError, "reading records failed")
			return
		}
		if earlier > 0 && !c.send(windowMsg{Type: MsgWindow, Earlier: earlier, From: from}) {
			return
		}
		cursor = from
	}
	// open: the client has not yet had a records message with more=false
	// since it connected or since a message that said more would follow.
	open := true
	page := replayFirstPage
	for {
		for {
			// Flow control: at most one message in flight during a replay, and pages
			// sized by bytes, so a replay holds about replayBytes however large the
			// records; a client that stops reading is dropped.
			if !c.waitRoom(ctx, replayInFlight) {
				return
			}
			recs, err := c.b.Store.Records(ctx, id, cursor, page)
			if err != nil {
				if ctx.Err() == nil {
					c.b.log.Warn("browser: read records", "session", id, "error", err)
					c.close(websocket.StatusInternalError, "reading records failed")
				}
				return
			}
			more := len(recs) == page
			page = nextPage(recs)
			if len(recs) == 0 && open {
				// The replay is over: an empty page says so (also after a
				// page that was full to the last record).
				if !c.send(recordsMsg{Type: MsgRecords, Records: []store.Record{}}) {
					return
				}
			}
			for chunk := range chunks(recs) {
				last := &chunk[len(chunk)-1] == &recs[len(recs)-1]
				if !c.waitRoom(ctx, replayInFlight) || !c.send(recordsMsg{Type: MsgRecords, Records: chunk, More: more || !last}) {
					return
				}
				cursor = chunk[len(chunk)-1].Seq
			}
			open = more
			if !more {
				break
			}
		}
		select {
		case <-wake:
		case <-ctx.Done():
			return
		case <-c.done:
			return
		case <-c.b.Daemon.Closing():
			c.close(websocket.StatusGoingAway, "klbr-core is shutting down")
			return
		}
	}
}

// Replay memory: a page is read from the store at a time, sized so that it holds about
// replayBytes of content (the first page is small: the records' size is not known yet),
// and at most replayInFlight messages wait for the client beyond the one being written.
// 50 parallel replays of 64 KiB records then stay within a few MB each
// (BenchmarkReplayMemory, docs/performance.md).
const (
	replayBytes     = 1 << 20
	replayFirstPage = 16
	replayInFlight  = 1
)

// nextPage sizes the next replay page from the last one's records.
func nextPage(recs []store.Record) int {
	size := 0
	for _, r := range recs {
		size += len(r.Content) + 256
	}
	if len(recs) == 0 || size == 0 {
		return ReplayPage
	}
	return max(1, min(ReplayPage, len(recs)*replayBytes/size))
}

// MaxMessageBytes bounds the records content in one records message (one
// record may exceed it alone).
const MaxMessageBytes = 1 << 20

// chunks splits a page of records into messages of at most MaxMessageBytes
// of content, in order, each with at least one record.
func chunks(recs []store.Record) iter.Seq[[]store.Record] {
	return func(yield func([]store.Record) bool) {
		start, size := 0, 0
		for i, r := range recs {
			n := len(r.Content) + 256
			if i > start && size+n > MaxMessageBytes {
				if !yield(recs[start:i]) {
					return
				}
				start, size = i, 0
			}
			size += n
		}
		if start < len(recs) {
			yield(recs[start:])
		}
	}
}

// waitRoom waits until at most n messages are queued, for at most the
// write timeout.
func (c *client) waitRoom(ctx context.Context, n int) bool {
	if len(c.queue) <= n {
		return true
	}
	t := time.NewTimer(c.b.writeTimeout)
	defer t.Stop()
	for len(c.queue) > n {
		select {
		case <-c.sent:
		case <-t.C:
			c.slow()
			return false
		case <-ctx.Done():
			return false
		case <-c.done:
			return false
		}
	}
	return true
}

func (c *client) slow() {
	c.b.log.Warn("browser: dropping a slow client")
	c.b.slowDrops.Add(1)
	c.dropped.Store(true)
	c.close(websocket.StatusPolicyViolation, "client too slow: send queue full")
}

// send queues v for the client without blocking; a full queue drops the
// client.
func (c *client) send(v any) bool {
	b, err := json.Marshal(v)
	if err != nil {
		c.b.log.Error("browser: encode", "error", err)
		return false
	}
	select {
	case <-c.done:
		return false
	default:
	}
	select {
	case c.queue <- b:
		return true
	default:
		c.slow()
		return false
	}
}

// writeLoop writes queued messages, records and answers first; pending
// deltas go out only when nothing else is queued.
func (c *client) writeLoop(ctx context.Context) {
	for {
		var b []byte
		fromQueue := true
		select {
		case <-ctx.Done():
			return
		case <-c.done:
			return
		case b = <-c.queue:
		default:
			select {
			case <-ctx.Done():
				return
			case <-c.done:
				return
			case b = <-c.queue:
			case <-c.deltaReady:
				if b = c.takeDeltas(); b == nil {
					continue
				}
				fromQueue = false
			}
		}
		wctx, cancel := context.WithTimeout(ctx, c.b.writeTimeout)
		err := c.conn.Write(wctx, websocket.MessageText, b)
		timedOut := errors.Is(wctx.Err(), context.DeadlineExceeded)
		cancel()
		if err != nil {
			switch {
			case timedOut:
				// The client did not take one message in the write timeout.
				c.b.log.Warn("browser: dropping a slow client: a write timed out")
				c.b.slowDrops.Add(1)
				c.dropped.Store(true)
				c.close(websocket.StatusPolicyViolation, "client too slow")
			case c.dropped.Load() || ctx.Err() != nil:
				// Already dropped (its queue stayed full), or the socket ends.
			default:
				c.b.log.Warn("browser: write failed; dropping the client", "error", err)
				c.close(websocket.StatusInternalError, "write failed")
			}
			return
		}
		if fromQueue {
			select {
			case c.sent <- struct{}{}:
			default:
			}
		}
	}
}

func (c *client) readLoop(ctx context.Context, id string) {
	for {
		raw, err := c.readFrame(ctx)
		if err != nil {
			c.readFailed(err)
			return
		}
		m, err := DecodeClientMessage(raw)
		if err != nil {
			if !c.send(errorMsg{Type: MsgError, Code: api.CodeInvalid, Message: err.Error()}) {
				return
			}
			continue
		}
		if !c.handle(ctx, id, m) {
			return
		}
	}
}

func (c *client) handle(ctx context.Context, id string, m ClientMessage) bool {
	switch m.Type {
	case MsgSend:
		got, err := c.b.Admit.Admit(ctx, admission.DoorBrowser, admission.Input{
			Session: id, SourceKind: admission.SourceOperator, SourceKey: m.Key,
			Conversation: "operator", Author: "operator", Body: m.Text,
		})
		if err != nil {
			return c.send(errorMsg{Type: MsgError, Code: errorCode(err), Message: err.Error(), Key: m.Key})
		}
		rec := receiptMsg{Type: MsgReceipt, Key: m.Key, Session: id, ID: got.InputID, EventID: got.EventID, Duplicate: got.Duplicate}
		if s, err := c.b.Store.Session(ctx, id); err == nil {
			rec.Unanswered = session.Unanswered(s)
		}
		return c.send(rec)
	case MsgDrain, MsgStop:
		stop := m.Type == MsgStop
		msg := "draining: admission is closed; klbr-core exits once accepted work has finished"
		if stop {
			msg = "stopping: admission is closed and running work is interrupted; klbr-core exits next"
		}
		c.b.log.Info("browser: shutdown requested", "stop", stop)
		ok := c.send(acceptedMsg{Type: MsgAccepted, Action: m.Type, Message: msg})
		c.b.Daemon.Shutdown(stop)
		return ok
	case MsgReset, MsgCompact, MsgSessionDrain, MsgSessionStop, MsgSessionPause, MsgSessionStart, MsgActivate, MsgRollback, MsgEditSoul, MsgJobCancel, MsgSpendCap:
		// A control may take long (a drain waits for accepted work): it
		// runs on its own, and other messages are handled meanwhile.
		go c.control(ctx, id, m)
		return true
	case MsgHello:
		return c.send(errorMsg{Type: MsgError, Code: api.CodeInvalid, Message: "hello was already received; reconnect to change session or cursor"})
	}
	return true
}

func errorCode(err error) string {
	switch {
	case errors.Is(err, admission.ErrInvalid):
		return api.CodeInvalid
	case errors.Is(err, admission.ErrForbidden):
		return api.CodeForbidden
	case errors.Is(err, store.ErrUnknownSession):
		return api.CodeNotFound
	case errors.Is(err, admission.ErrDraining):
		return api.CodeDraining
	case errors.Is(err, session.ErrDraining), errors.Is(err, session.ErrStopped), errors.Is(err, store.ErrSessionStopped):
		return api.CodeConflict
	}
	return api.CodeInternal
}

// truncate keeps a close reason within the 123 bytes a close frame allows.
func truncate(s string) string {
	if len(s) <= 120 {
		return s
	}
	return strings.ToValidUTF8(s[:120], "")
}
