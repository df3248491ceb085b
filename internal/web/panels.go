package web

// The home's panels: Discord conversations and attention items, the
// active and last-good release, history search. Each reads the daemon's
// own store (or history reader); none calls the model.

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/klbr-dev/klbr/internal/api"
	"github.com/klbr-dev/klbr/internal/history"
	"github.com/klbr-dev/klbr/internal/session"
	"github.com/klbr-dev/klbr/internal/store"
)

// MaxMarkBody bounds a POST /v2/items/{item}/mark body.
const MaxMarkBody = 4096

func (b *browser) panelRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /v2/discord", b.guard(http.StatusUnauthorized, b.handleDiscord))
	mux.HandleFunc("GET /v2/discord/{conversation}", b.guard(http.StatusUnauthorized, b.handleConversation))
	mux.HandleFunc("POST /v2/items/{item}/mark", b.guard(http.StatusUnauthorized, b.handleMark))
	mux.HandleFunc("GET /v2/releases", b.guard(http.StatusUnauthorized, b.handleReleases))
	mux.HandleFunc("GET /v2/history", b.guard(http.StatusUnauthorized, b.handleHistory))
	mux.HandleFunc("GET /v2/history/{ref}", b.guard(http.StatusUnauthorized, b.handleHistoryRead))
	mux.HandleFunc("GET /v2/jobs", b.guard(http.StatusUnauthorized, b.handleJobs))
	mux.HandleFunc("GET /v2/children", b.guard(http.StatusUnauthorized, b.handleChildren))
	mux.HandleFunc("GET /v2/releases/diff", b.guard(http.StatusUnauthorized, b.handleReleaseDiff))
	b.heldRoutes(mux)
	mux.HandleFunc("GET /v2/spend", b.guard(http.StatusUnauthorized, b.handleSpend))
}

func writeJSONStatus(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func jsonError(w http.ResponseWriter, status int, code, msg string) {
	writeJSONStatus(w, status, map[string]string{"code": code, "error": msg})
}

// storeError answers a store error with its status.
func storeError(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, store.ErrUnknownSession), errors.Is(err, store.ErrUnknownConversation), errors.Is(err, store.ErrUnknownItem):
		jsonError(w, http.StatusNotFound, api.CodeNotFound, err.Error())
	case errors.Is(err, store.ErrAttentionMove):
		jsonError(w, http.StatusConflict, api.CodeConflict, err.Error())
	default:
		jsonError(w, http.StatusInternalServerError, api.CodeInternal, err.Error())
	}
}

// sessionParam is ?session= (default "default"), checked.
func sessionParam(w http.ResponseWriter, r *http.Request) (string, bool) {
	id := r.URL.Query().Get("session")
	if id == "" {
		id = "default"
	}
	if !session.ValidID(id) {
		jsonError(w, http.StatusBadRequest, api.CodeInvalid, "bad session name")
		return "", false
	}
	return id, true
}

// discordView is GET /v2/discord: every conversation (its alias, kind,
// name, how many of its items wait for attention, how many messages klbr
// admitted there) and the session's attention items, newest first.
type discordView struct {
	Conversations []discordConversation `json:"conversations"`
	Items         []store.AttentionItem `json:"items"`
}

// discordConversation is a conversation with its message count: the page
// keeps how many it has shown (per browser) and counts the rest unread.
type discordConversation struct {
	store.Conversation
	store.ConversationCount
}

func (b *browser) handleDiscord(w http.ResponseWriter, r *http.Request) {
	id, ok := sessionParam(w, r)
	if !ok {
		return
	}
	convs, err := b.Store.Conversations(r.Context())
	if err != nil {
		storeError(w, err)
		return
	}
	counts, err := b.Store.ConversationCounts(r.Context())
	if err != nil {
		storeError(w, err)
		return
	}
	items, err := b.Store.AttentionItems(r.Context(), id, nil, 200)
	if err != nil {
		storeError(w, err)
		return
	}
	out := discordView{Conversations: []discordConversation{}, Items: items}
	for _, c := range convs {
		out.Conversations = append(out.Conversations, discordConversation{Conversation: c, ConversationCount: counts[c.Alias]})
	}
	if out.Items == nil {
		out.Items = []store.AttentionItem{}
	}
	writeJSONStatus(w, http.StatusOK, out)
}

// conversationView is GET /v2/discord/{conversation}: what klbr admitted
// there and what it sent, oldest first (the newest ?limit=, default 200).
type conversationView struct {
	Conversation store.Conversation          `json:"conversation"`
	Messages     []store.ConversationMessage `json:"messages"`
}

func (b *browser) handleConversation(w http.ResponseWriter, r *http.Request) {
	limit := 200
	if q := r.URL.Query().Get("limit"); q != "" {
		n, err := strconv.Atoi(q)
		if err != nil || n < 1 || n > store.MaxConversationPage {
			jsonError(w, http.StatusBadRequest, api.CodeInvalid, fmt.Sprintf("limit must be 1 to %d", store.MaxConversationPage))
			return
		}
		limit = n
	}
	ref := r.PathValue("conversation")
	if len(ref) > 64 {
		jsonError(w, http.StatusBadRequest, api.CodeInvalid, "conversation: an alias (d1) or key (discord:<channel id>)")
		return
	}
	c, msgs, err := b.Store.ConversationLog(r.Context(), ref, limit)
	if err != nil {
		storeError(w, err)
		return
	}
	if msgs == nil {
		msgs = []store.ConversationMessage{}
	}
	writeJSONStatus(w, http.StatusOK, conversationView{Conversation: c, Messages: msgs})
}

// markRequest is the body of POST /v2/items/{item}/mark.
type markRequest struct {
	Status string `json:"status"`
	Note   string `json:"note,omitempty"`
}

// decodeMark decodes and checks a mark body (at most MaxMarkBody bytes).
func decodeMark(body []byte) (markRequest, error) {
	var m markRequest
	if len(body) > MaxMarkBody {
		return m, fmt.Errorf("%w: body over %d bytes", ErrBadMessage, MaxMarkBody)
	}
	dec := json.NewDecoder(strings.NewReader(string(body)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return m, fmt.Errorf("%w: %v", ErrBadMessage, err)
	}
	if dec.More() {
		return m, fmt.Errorf("%w: trailing data", ErrBadMessage)
	}
	switch m.Status {
	case store.ItemPending, store.ItemSeen, store.ItemActed, store.ItemIgnored:
	default:
		return m, fmt.Errorf("%w: status must be pending, seen, acted or ignored", ErrBadMessage)
	}
	if len(m.Note) > 1000 {
		return m, fmt.Errorf("%w: note: at most 1000 bytes", ErrBadMessage)
	}
	return m, nil
}

// pageAction checks what every action the page posts must be: from this
// page's own origin (or with the bearer token), JSON, naming a positive
// integer in the path value param; it reads the body, at most max bytes
// (decoders refuse what is longer). On a refusal it has answered, and ok
// is false.
func (b *browser) pageAction(w http.ResponseWriter, r *http.Request, what, param string, max int64) (id int64, body []byte, ok bool) {
	if r.Header.Get("Origin") == "" && presentedBearer(r) == "" || !originOK(r) {
		b.refuse(w, r, http.StatusForbidden, what+" without this page's Origin")
		return 0, nil, false
	}
	if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		jsonError(w, http.StatusUnsupportedMediaType, api.CodeInvalid, "send JSON")
		return 0, nil, false
	}
	id, err := strconv.ParseInt(r.PathValue(param), 10, 64)
	if err != nil || id < 1 {
		jsonError(w, http.StatusBadRequest, api.CodeInvalid, param+" must be a positive integer")
		return 0, nil, false
	}
	body, err = io.ReadAll(io.LimitReader(r.Body, max+1))
	if err != nil {
		jsonError(w, http.StatusBadRequest, api.CodeInvalid, err.Error())
		return 0, nil, false
	}
	return id, body, true
}

// handleMark records the operator's decision on an attention item (the
// operator API's mark; decision origin "operator"). Pending reopens an
// acted or ignored item. A browser must send it from this page's own
// origin, as JSON: no other page can make it.
func (b *browser) handleMark(w http.ResponseWriter, r *http.Request) {
	id, body, ok := b.pageAction(w, r, "mark", "item", MaxMarkBody)
	if !ok {
		return
	}
	req, err := decodeMark(body)
	if err != nil {
		jsonError(w, http.StatusBadRequest, api.CodeInvalid, err.Error())
		return
	}
	if err := b.Store.Write(r.Context(), func(tx *store.Tx) error {
		_, err := tx.Mark(id, req.Status, store.OriginOperator, req.Note, 0)
		return err
	}); err != nil {
		storeError(w, err)
		return
	}
	it, err := b.Store.AttentionItem(r.Context(), id)
	if err != nil {
		storeError(w, err)
		return
	}
	b.log.Info("browser: attention item marked", "item", id, "status", req.Status)
	writeJSONStatus(w, http.StatusOK, it)
}

// presentedBearer is the request's Authorization: Bearer token, if any.
func presentedBearer(r *http.Request) string {
	v, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return strings.TrimSpace(v)
}

// releasesView is GET /v2/releases: the session's active release, the
// last good one (the release a rollback would activate: the newest of an
// earlier epoch that still verifies) and its recent activations.
type releasesView struct {
	Session     string             `json:"session"`
	Epoch       int64              `json:"epoch"`
	Active      string             `json:"active"`
	LastGood    *store.Activation  `json:"last_good"`
	Activations []store.Activation `json:"activations"` // newest first, at most 20
	// Pending is a candidate waiting for activation with its diff; nothing
	// builds one yet (releases are activated at once).
	Pending any `json:"pending"`
}

func (b *browser) handleReleases(w http.ResponseWriter, r *http.Request) {
	id, ok := sessionParam(w, r)
	if !ok {
		return
	}
	sess, err := b.Store.Session(r.Context(), id)
	if err != nil {
		storeError(w, err)
		return
	}
	acts, err := b.Store.Activations(r.Context(), id)
	if err != nil {
		storeError(w, err)
		return
	}
	out := releasesView{Session: id, Epoch: sess.BehaviorEpoch, Active: sess.PolicyRevision, Activations: []store.Activation{}}
	// Activations come oldest first; the view is newest first.
	for i := len(acts) - 1; i >= 0; i-- {
		a := acts[i]
		if len(out.Activations) < 20 {
			out.Activations = append(out.Activations, a)
		}
		if out.LastGood == nil && a.Epoch < sess.BehaviorEpoch && a.Release != sess.PolicyRevision {
			if b.Releases == nil {
				continue
			}
			if _, err := b.Releases.Verify(a.Release); err == nil {
				out.LastGood = &a
			}
		}
	}
	writeJSONStatus(w, http.StatusOK, out)
}

// handleHistory is GET /v2/history?session=S&q=Q&lane=L&before=N: the
// history search of `klbr-core history search`, newest first.
func (b *browser) handleHistory(w http.ResponseWriter, r *http.Request) {
	if b.History == nil {
		jsonError(w, http.StatusServiceUnavailable, api.CodeUnavailable, "history is not available in this daemon")
		return
	}
	id, ok := sessionParam(w, r)
	if !ok {
		return
	}
	q := r.URL.Query()
	var before int64
	if v := q.Get("before"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			jsonError(w, http.StatusBadRequest, api.CodeInvalid, "before must be a continuation from a previous page")
			return
		}
		before = n
	}
	res, err := b.History.Search(r.Context(), "", q.Get("q"), history.Scope{Session: id, Lane: q.Get("lane"), Before: before}, 30)
	if err != nil {
		jsonError(w, http.StatusBadRequest, api.CodeInvalid, err.Error())
		return
	}
	if res.Hits == nil {
		res.Hits = []store.Hit{}
	}
	writeJSONStatus(w, http.StatusOK, res)
}

// handleHistoryRead is GET /v2/history/{ref}: the exact original (at most
// 64 KiB of it).
func (b *browser) handleHistoryRead(w http.ResponseWriter, r *http.Request) {
	if b.History == nil {
		jsonError(w, http.StatusServiceUnavailable, api.CodeUnavailable, "history is not available in this daemon")
		return
	}
	ref := r.PathValue("ref")
	if len(ref) > 128 {
		jsonError(w, http.StatusBadRequest, api.CodeInvalid, "ref too long")
		return
	}
	res, err := b.History.Read(r.Context(), "", ref, 64<<10, 0)
	if err != nil {
		jsonError(w, http.StatusNotFound, api.CodeNotFound, err.Error())
		return
	}
	writeJSONStatus(w, http.StatusOK, res)
}
