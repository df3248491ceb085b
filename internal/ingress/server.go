// Package ingress is the core side of the ingress protocol (DESIGN.md §4):
// the HTTP/JSON server on ingress.sock that klbr-discord talks to. It admits
// normalized Discord messages with source authority only (never operator
// authority), hands pending outbox effects to the transport (a claim makes
// them attempting), records the receipts the transport posts, and passes
// backreads through to the transport without durability.
package ingress

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/klbr-dev/klbr/internal/admission"
	"github.com/klbr-dev/klbr/internal/artifacts"
	"github.com/klbr-dev/klbr/internal/httpguard"
	"github.com/klbr-dev/klbr/internal/ingress/ingressapi"
	"github.com/klbr-dev/klbr/internal/placement"
	"github.com/klbr-dev/klbr/internal/session"
	"github.com/klbr-dev/klbr/internal/store"
	"github.com/klbr-dev/klbr/internal/unixsock"
)

// ErrNoTransport reports a read asked while no transport is connected.
var ErrNoTransport = errors.New("klbr-discord is not connected")

// Config is what a Server is made of.
type Config struct {
	Store *store.Store
	Admit *admission.Admitter
	// Session receives the admitted messages; empty means the default session.
	Session string
	Log     *slog.Logger
	Clock   func() time.Time
	// PendingAging ignores attention items pending longer than this, with
	// decision_origin aging (0: never). Aging starts with the first request
	// of a transport (hello or admit) and stops at Close.
	PendingAging time.Duration
	// Admitted, if set, is told of each committed batch (the attention
	// scheduler wakes on directed messages through it).
	Admitted func(session string, directed, ambient int)
	// Artifacts returns the store fetched attachments go to (nil, or nil
	// returned: uploads are refused 503); AttachmentMaxBytes caps one (0:
	// DefaultAttachmentMaxBytes).
	Artifacts          func() *artifacts.Store
	AttachmentMaxBytes int64
	// Limits are the ingress socket's timeouts and connection bound.
	Limits httpguard.Limits
	// Operator is [discord] operator_user_id when notify_held is true: the
	// transport DMs them each held effect, and a button press is honored
	// only from them. Empty: no notices, no decisions from Discord.
	Operator string
}

// Server serves the ingress API.
type Server struct {
	cfg     Config
	kick    chan struct{} // buffered(1): effects or reads may be waiting
	closing chan struct{}
	once    sync.Once

	itemAdmitted chan struct{} // buffered(1): a DM or mention was admitted (aging wakes)
	agingOnce    sync.Once
	agingDone    chan struct{} // closed when the aging goroutine ended; nil when it never started

	mu       sync.Mutex // guards the fields below
	reads    map[int64]*pendingRead
	queue    []int64   // reads not handed to a transport yet
	nextRead int64     // last read id given out
	polled   time.Time // when a transport last claimed work
	polling  int       // claims waiting now
	gateway  ingressapi.GatewayStats
	sender   *sender // the transport that said hello last: the only one that may deliver
	// notifying are held effects handed out for a notice and not reported
	// yet, with when: not handed out again for noticeRetry.
	notifying map[int64]time.Time
}

type pendingRead struct {
	req    ingressapi.Read
	answer chan ingressapi.ReadAnswer // buffered(1)
}

// New returns a Server.
func New(cfg Config) *Server {
	if cfg.Session == "" {
		cfg.Session = session.DefaultID
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	return &Server{cfg: cfg, kick: make(chan struct{}, 1), closing: make(chan struct{}), reads: map[int64]*pendingRead{},
		itemAdmitted: make(chan struct{}, 1), notifying: map[int64]time.Time{}}
}

// HTTPServer returns an http.Server for the ingress socket, recording each
// connection's peer credentials.
func (s *Server) HTTPServer() *http.Server {
	return httpguard.Apply(&http.Server{
		Handler:     s.Handler(),
		ConnContext: unixsock.ConnContextClassified(placement.WorkerOf),
		ErrorLog:    slog.NewLogLogger(s.cfg.Log.Handler(), slog.LevelWarn),
	}, s.cfg.Limits)
}

// Close ends waiting claims (a daemon drain) and stops aging. Calling it
// twice is safe.
func (s *Server) Close() {
	s.once.Do(func() { close(s.closing) })
	s.agingOnce.Do(func() {}) // aging cannot start after Close
	if s.agingDone != nil {
		<-s.agingDone
	}
}

// Handler routes the API under /v1, behind the peer check.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/inputs", s.handleAdmit)
	mux.HandleFunc("POST /v1/transport/hello", s.handleHello)
	mux.HandleFunc("POST /v1/effects/claim", s.fenced(s.handleClaim))
	mux.HandleFunc("POST /v1/effects/{id}/receipt", s.fenced(s.handleReceipt))
	mux.HandleFunc("POST /v1/reads/{id}", s.fenced(s.handleReadAnswer))
	mux.HandleFunc("POST /v1/held/{id}/notified", s.fenced(s.handleHeldNotified))
	mux.HandleFunc("POST /v1/held/{id}/decide", s.fenced(s.handleHeldDecide))
	mux.HandleFunc("PUT /v1/attachments/{message}/{attachment}", s.fenced(s.handleUpload))
	mux.HandleFunc("POST /v1/attachments/{message}/{attachment}/failure", s.fenced(s.handleFetchFailure))
	mux.HandleFunc("GET /v1/effects/{id}/files/{n}", s.fenced(s.handleEffectFile))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, ingressapi.CodeNotFound, "no such ingress endpoint: "+r.Method+" "+r.URL.Path)
	})
	return s.checkPeer(mux)
}

// checkPeer requires the kernel's word on who connected. Who may connect at
// all is the socket's mode and group (0660); whoever it is, an ingress peer
// has source authority only.
func (s *Server) checkPeer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cred, ok := unixsock.FromContext(r.Context())
		if !ok {
			writeError(w, http.StatusForbidden, ingressapi.CodeForbidden, "the ingress API serves Unix socket peers only")
			return
		}
		if cred.Worker != "" {
			s.cfg.Log.Warn("ingress API: refused a worker", "peer_pid", cred.PID, "why", cred.Worker, "path", r.URL.Path)
			writeError(w, http.StatusForbidden, ingressapi.CodeForbidden, "the ingress API serves the transport, not klbr workers or their descendants (the peer is "+cred.Worker+")")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// Kick tells waiting claims that an effect was enqueued.
func (s *Server) Kick() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

func (s *Server) handleAdmit(w http.ResponseWriter, r *http.Request) {
	s.StartAging(s.cfg.PendingAging)
	body, err := io.ReadAll(io.LimitReader(r.Body, ingressapi.MaxRequestBytes+1))
	if err != nil {
		writeError(w, http.StatusBadRequest, ingressapi.CodeInvalid, "read request body: "+err.Error())
		return
	}
	if len(body) > ingressapi.MaxRequestBytes {
		writeError(w, http.StatusRequestEntityTooLarge, ingressapi.CodeTooLarge, fmt.Sprintf("request body over %d bytes", ingressapi.MaxRequestBytes))
		return
	}
	req, bad, err := decodeAdmit(body)
	if err != nil {
		writeError(w, http.StatusBadRequest, ingressapi.CodeInvalid, err.Error())
		return
	}
	results := make([]ingressapi.AdmitResult, len(req.Messages))
	var ins []admission.Input
	var idx []int // ins[j] is req.Messages[idx[j]]
	for i, m := range req.Messages {
		if msg, ok := bad[i]; ok {
			results[i].Error = &ingressapi.ErrorBody{Code: ingressapi.CodeInvalid, Message: msg}
			continue
		}
		ins = append(ins, s.input(m))
		idx = append(idx, i)
	}
	discord := make([]store.DiscordAdmitted, len(ins))
	var directed, ambient int
	// The commit does not depend on the client's socket (see localapi's handleSend).
	actx, acancel := context.WithTimeout(context.WithoutCancel(r.Context()), 30*time.Second)
	defer acancel()
	got, errs, err := s.cfg.Admit.AdmitBatch(actx, admission.DoorIngress, ins, func(tx *store.Tx, j int, a store.Admitted) (err error) {
		m := req.Messages[idx[j]]
		if m.Mode == ingressapi.ModeGap {
			return nil
		}
		discord[j], err = tx.RecordDiscordMessage(a, s.discordMessage(m))
		return err
	})
	if err != nil {
		s.fail(w, err)
		return
	}
	for j, i := range idx {
		if errs[j] != nil {
			code := ingressapi.CodeInvalid
			if errors.Is(errs[j], admission.ErrForbidden) {
				code = ingressapi.CodeForbidden
			}
			results[i].Error = &ingressapi.ErrorBody{Code: code, Message: errs[j].Error()}
			continue
		}
		results[i] = ingressapi.AdmitResult{InputID: got[j].InputID, EventID: got[j].EventID, Duplicate: got[j].Duplicate,
			Conversation: discord[j].Conversation, ItemID: discord[j].ItemID}
		if !got[j].Duplicate {
			if ins[j].Directed {
				directed++
			} else {
				ambient++
			}
		}
	}
	if directed > 0 {
		select {
		case s.itemAdmitted <- struct{}{}:
		default:
		}
	}
	if s.cfg.Admitted != nil && directed+ambient > 0 {
		s.cfg.Admitted(s.cfg.Session, directed, ambient)
	}
	writeJSON(w, http.StatusOK, ingressapi.AdmitResponse{Results: results})
}

// input is the admission input of a checked message. The source kind is
// discord whatever the message says: the door decides authority.
func (s *Server) input(m ingressapi.Message) admission.Input {
	in := admission.Input{
		Session: s.cfg.Session, SourceKind: admission.SourceDiscord, SourceKey: "discord:" + m.MessageID,
		Conversation: store.ConversationKey(m.ChannelID), Author: author(m),
		Directed: m.Mode == ingressapi.ModeDM || m.Mode == ingressapi.ModeMention, OccurredAt: m.OccurredAt, Body: m.Content,
	}
	if m.Mode == ingressapi.ModeGap {
		in.SourceKey, in.Conversation, in.Author = "discord-gap:"+m.MessageID, "discord:gateway", "klbr-discord"
	}
	if len(m.Content) == 0 {
		in.Body = fmt.Sprintf("(%d attachments)", len(m.Attachments))
	}
	return in
}

func author(m ingressapi.Message) string {
	if m.AuthorName == "" {
		return m.AuthorID
	}
	return m.AuthorName + " (" + m.AuthorID + ")"
}

func (s *Server) discordMessage(m ingressapi.Message) store.DiscordMessage {
	var att json.RawMessage
	if len(m.Attachments) > 0 {
		att, _ = json.Marshal(m.Attachments)
	}
	return store.DiscordMessage{
		Session: s.cfg.Session, MessageID: m.MessageID, ChannelID: m.ChannelID, ChannelKind: m.ChannelKind, GuildID: m.GuildID,
		ParentID: m.ParentID, ChannelName: m.ChannelName, AuthorID: m.AuthorID, Mode: m.Mode, ReplyTo: m.ReplyTo, Attachments: att,
		OutOfOrder: m.OutOfOrder,
	}
}

func (s *Server) handleHello(w http.ResponseWriter, r *http.Request) {
	s.StartAging(s.cfg.PendingAging)
	var req ingressapi.HelloRequest
	if !decodeRequest(w, r, &req) {
		return
	}
	fence, err := s.takeSender(r, clip(req.Instance))
	if err != nil {
		s.cfg.Log.Warn("refused a second transport", "instance", clip(req.Instance), "error", err)
		writeError(w, http.StatusConflict, ingressapi.CodeFenced, err.Error())
		return
	}
	var left []store.Effect
	if err := s.cfg.Store.Write(r.Context(), func(tx *store.Tx) (err error) {
		left, err = tx.Attempting()
		return err
	}); err != nil {
		s.fail(w, err)
		return
	}
	convs, err := s.cfg.Store.Conversations(r.Context())
	if err != nil {
		s.fail(w, err)
		return
	}
	// The most recently active first, bounded.
	sort.Slice(convs, func(i, j int) bool { return store.SnowflakeLess(convs[j].LastMessageID, convs[i].LastMessageID) })
	convs = convs[:min(len(convs), ingressapi.MaxBackfillConversations)]
	fetches, err := s.cfg.Store.PendingFetches(r.Context(), s.cfg.Session, ingressapi.MaxPendingFetches)
	if err != nil {
		s.fail(w, err)
		return
	}
	s.cfg.Log.Info("transport connected", "instance", clip(req.Instance), "reconcile", len(left), "conversations", len(convs))
	resp := ingressapi.HelloResponse{Reconcile: make([]ingressapi.Effect, len(left)), Conversations: make([]ingressapi.ConversationRef, len(convs)), Fence: fence}
	for i, e := range left {
		resp.Reconcile[i] = wireEffect(e)
	}
	for _, f := range fetches {
		resp.Fetches = append(resp.Fetches, ingressapi.PendingFetch(f))
	}
	for i, c := range convs {
		resp.Conversations[i] = ingressapi.ConversationRef{ChannelID: c.ChannelID, Kind: c.Kind, GuildID: c.GuildID, ParentID: c.ParentID,
			Name: c.Name, LastMessageID: backfillCursor(c)}
	}
	writeJSON(w, http.StatusOK, resp)
}

func wireEffect(e store.Effect) ingressapi.Effect {
	w := ingressapi.Effect{ID: e.ID, Kind: e.Kind, State: e.State, ChannelID: e.ChannelID, Nonce: e.Nonce, Text: e.Text,
		Emoji: e.Emoji, Target: e.Target, ReplyReference: e.ReplyReference, Attempts: e.Attempts}
	if e.ClaimedAt != nil {
		w.ClaimedAt = *e.ClaimedAt
	}
	return w
}

func (s *Server) handleClaim(w http.ResponseWriter, r *http.Request) {
	var req ingressapi.ClaimRequest
	if !decodeRequest(w, r, &req) {
		return
	}
	if req.Limit < 1 || req.Limit > ingressapi.MaxClaim {
		req.Limit = ingressapi.MaxClaim
	}
	wait := time.Duration(req.WaitMS) * time.Millisecond
	if wait < 0 || wait > ingressapi.MaxClaimWait {
		wait = ingressapi.MaxClaimWait
	}
	s.mu.Lock()
	s.polling++
	s.polled = s.cfg.Clock()
	if req.Gateway != nil {
		s.gateway = *req.Gateway
	}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.polling--
		s.polled = s.cfg.Clock()
		s.mu.Unlock()
	}()
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		var effects []store.Effect
		if err := s.cfg.Store.Write(r.Context(), func(tx *store.Tx) (err error) {
			effects, err = tx.ClaimEffects(req.Limit)
			return err
		}); err != nil {
			s.fail(w, err)
			return
		}
		reads := s.takeReads()
		notify, err := s.heldToNotify(r.Context())
		if err != nil {
			s.fail(w, err)
			return
		}
		if len(effects) > 0 || len(reads) > 0 || len(notify) > 0 {
			resp := ingressapi.ClaimResponse{Effects: make([]ingressapi.Effect, len(effects)), Reads: reads, Notify: notify}
			for i, e := range effects {
				resp.Effects[i] = wireEffect(e)
				if e.Kind == store.EffectSend {
					var err error
					if resp.Effects[i].Files, err = s.effectFiles(r.Context(), e.ID); err != nil {
						s.fail(w, err)
						return
					}
				}
			}
			writeJSON(w, http.StatusOK, resp)
			return
		}
		select {
		case <-s.kick:
		case <-timer.C:
			writeJSON(w, http.StatusOK, ingressapi.ClaimResponse{Effects: []ingressapi.Effect{}, Reads: []ingressapi.Read{}})
			return
		case <-s.closing:
			writeError(w, http.StatusServiceUnavailable, ingressapi.CodeDraining, "klbr-core is draining")
			return
		case <-r.Context().Done():
			return
		}
	}
}

func (s *Server) handleReceipt(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id < 1 {
		writeError(w, http.StatusBadRequest, ingressapi.CodeInvalid, "the effect id is a positive integer")
		return
	}
	var req ingressapi.Receipt
	if !decodeRequest(w, r, &req) {
		return
	}
	switch req.State {
	case store.EffectConfirmed, store.EffectFailed, store.EffectUnknown, store.EffectPending:
	default:
		writeError(w, http.StatusBadRequest, ingressapi.CodeInvalid, fmt.Sprintf("state %q is not confirmed, failed, unknown or pending", clip(req.State)))
		return
	}
	if req.State == store.EffectConfirmed && req.MessageID != "" && !isSnowflake(req.MessageID) {
		writeError(w, http.StatusBadRequest, ingressapi.CodeInvalid, "message_id is not a Discord id")
		return
	}
	if len(req.Error) > 2048 || len(req.ErrorCode) > 64 || len(req.Evidence) > 256 {
		writeError(w, http.StatusBadRequest, ingressapi.CodeInvalid, "error is at most 2048 bytes, error_code 64, evidence 256")
		return
	}
	ids, msg := receiptFileIDs(req)
	if msg != "" {
		writeError(w, http.StatusBadRequest, ingressapi.CodeInvalid, msg)
		return
	}
	var e store.Effect
	// A receipt is evidence: record it even if the transport hangs up now.
	err = s.cfg.Store.Write(context.WithoutCancel(r.Context()), func(tx *store.Tx) (err error) {
		e, err = tx.SettleEffect(id, store.Outcome{State: req.State, MessageID: req.MessageID, ErrorCode: req.ErrorCode,
			Error: req.Error, Evidence: req.Evidence, AttachmentIDs: ids})
		return err
	})
	if err != nil {
		s.fail(w, err)
		return
	}
	if req.State == store.EffectPending {
		s.Kick()
	}
	writeJSON(w, http.StatusOK, ingressapi.ReceiptResponse{ID: e.ID, State: e.State, Repeat: e.Repeat})
}

// Read asks the transport to read a channel's history and waits for the
// answer, or ctx's end. Nothing of it is durable.
func (s *Server) Read(ctx context.Context, req ingressapi.Read) ([]ingressapi.HistoryMessage, error) {
	s.mu.Lock()
	if !s.connectedLocked() {
		s.mu.Unlock()
		return nil, fmt.Errorf("%w: history cannot be read now", ErrNoTransport)
	}
	s.nextRead++
	req.ID = s.nextRead
	p := &pendingRead{req: req, answer: make(chan ingressapi.ReadAnswer, 1)}
	s.reads[req.ID] = p
	s.queue = append(s.queue, req.ID)
	s.mu.Unlock()
	s.Kick()
	defer func() {
		s.mu.Lock()
		delete(s.reads, req.ID)
		s.mu.Unlock()
	}()
	select {
	case a := <-p.answer:
		if a.Error != "" {
			return nil, fmt.Errorf("read: %s", a.Error)
		}
		return a.Messages, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("read: no answer from klbr-discord: %w", ctx.Err())
	}
}

// Connected reports whether a transport is polling for work, or polled recently.
func (s *Server) Connected() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.connectedLocked()
}

func (s *Server) connectedLocked() bool {
	return s.polling > 0 || (!s.polled.IsZero() && s.cfg.Clock().Sub(s.polled) < 5*time.Second)
}

func (s *Server) takeReads() []ingressapi.Read {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []ingressapi.Read{}
	for _, id := range s.queue {
		if p, ok := s.reads[id]; ok {
			out = append(out, p.req)
		}
	}
	s.queue = s.queue[:0]
	return out
}

func (s *Server) handleReadAnswer(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil {
		writeError(w, http.StatusBadRequest, ingressapi.CodeInvalid, "the read id is an integer")
		return
	}
	var a ingressapi.ReadAnswer
	if !decodeRequest(w, r, &a) {
		return
	}
	if len(a.Messages) > ingressapi.MaxReadLimit {
		writeError(w, http.StatusBadRequest, ingressapi.CodeInvalid, fmt.Sprintf("at most %d messages", ingressapi.MaxReadLimit))
		return
	}
	s.mu.Lock()
	p, ok := s.reads[id]
	s.mu.Unlock()
	if !ok {
		writeError(w, http.StatusNotFound, ingressapi.CodeNotFound, "no read is waiting under this id (it timed out)")
		return
	}
	select {
	case p.answer <- a:
	default:
	}
	writeJSON(w, http.StatusOK, struct{}{})
}

func decodeRequest(w http.ResponseWriter, r *http.Request, v any) bool {
	err := decodeBody(r.Body, ingressapi.MaxRequestBytes, v)
	if err == nil {
		return true
	}
	if errors.Is(err, errTooLarge) {
		writeError(w, http.StatusRequestEntityTooLarge, ingressapi.CodeTooLarge, err.Error())
	} else {
		writeError(w, http.StatusBadRequest, ingressapi.CodeInvalid, err.Error())
	}
	return false
}

func (s *Server) fail(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, admission.ErrDraining), errors.Is(err, session.ErrDraining), errors.Is(err, store.ErrClosed):
		writeError(w, http.StatusServiceUnavailable, ingressapi.CodeDraining, err.Error())
	case errors.Is(err, store.ErrUnknownEffect):
		writeError(w, http.StatusNotFound, ingressapi.CodeNotFound, err.Error())
	case errors.Is(err, store.ErrOutboxMove):
		writeError(w, http.StatusConflict, ingressapi.CodeConflict, err.Error())
	case errors.Is(err, store.ErrUnknownSession), errors.Is(err, store.ErrSessionStopped):
		writeError(w, http.StatusServiceUnavailable, ingressapi.CodeUnavailable, err.Error())
	case errors.Is(err, store.ErrStorage):
		// Nothing was committed, and klbr-core goes on once writes succeed
		// again (status and /metrics say so): the transport retries.
		writeError(w, http.StatusServiceUnavailable, ingressapi.CodeUnavailable, err.Error())
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		// Never an implicit 200 for work that did not happen.
		writeError(w, http.StatusServiceUnavailable, ingressapi.CodeUnavailable, "not done: the request ended before it completed ("+err.Error()+"); retry")
	default:
		s.cfg.Log.Error("ingress: internal error", "error", err)
		writeError(w, http.StatusInternalServerError, ingressapi.CodeInternal, err.Error())
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, ingressapi.Error{Error: ingressapi.ErrorBody{Code: code, Message: msg}})
}

// backfillCursor is the message a restarted transport reads history after:
// the newest one admitted from the conversation, never one of our own sends
// (a message written before our newest send may not have been admitted when
// the last transport stopped). A conversation nothing was admitted from yet
// (one we opened to send) reads after its newest message.
func backfillCursor(c store.Conversation) string {
	if c.LastInboundID != "" {
		return c.LastInboundID
	}
	return c.LastMessageID
}
