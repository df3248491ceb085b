// Package localapi is the operator API: HTTP + JSON over control.sock, for
// the CLI and other local tools. Only the daemon's own user and root may use
// it. It works without a model and without any policy hook.
package localapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/klbr-dev/klbr/internal/activation"
	"github.com/klbr-dev/klbr/internal/admission"
	"github.com/klbr-dev/klbr/internal/api"
	"github.com/klbr-dev/klbr/internal/behavior"
	"github.com/klbr-dev/klbr/internal/history"
	"github.com/klbr-dev/klbr/internal/httpguard"
	"github.com/klbr-dev/klbr/internal/placement"
	"github.com/klbr-dev/klbr/internal/session"
	"github.com/klbr-dev/klbr/internal/store"
	"github.com/klbr-dev/klbr/internal/unixsock"
	"github.com/klbr-dev/klbr/internal/workbench"
	"github.com/klbr-dev/klbr/internal/worker"
)

// Daemon is what the operator API asks of the process it runs in.
type Daemon interface {
	// Status reports the daemon's state.
	Status(ctx context.Context) (api.Status, error)
	// Shutdown asks the daemon to drain and exit; it returns at once.
	// With stop set, running work is interrupted instead of awaited.
	Shutdown(stop bool)
	// Closing is closed when the daemon begins to shut down; long-lived
	// answers (tail --follow) end then.
	Closing() <-chan struct{}
}

// Workbench runs operator cells and resets (package workbench).
type Workbench interface {
	Execute(ctx context.Context, session, code string, h worker.Handler) (workbench.Result, error)
	Reset(ctx context.Context, session, reason string) error
}

// commitTimeout bounds a commit once the request has been read.
const commitTimeout = 30 * time.Second

// Server serves the operator API.
type Server struct {
	store    *store.Store
	admit    *admission.Admitter
	sessions *session.Manager
	bench    Workbench // nil when cells cannot run; benchErr says why
	benchErr error

	activation *activation.Service // nil when releases are unavailable
	replay     Replayer            // nil when observers do not run
	releases   *behavior.Releases
	daemon     Daemon
	history    *history.Reader // nil: no history endpoints
	compact    Compacter       // nil: no manual compaction
	spend      Spender         // nil: no spend endpoints
	jobs       Jobs            // nil: jobs cannot be cancelled here
	gc         Collector       // nil: gc runs only offline
	kick       func()          // wakes the transport's claim after a release; nil: none
	hosts      Hosts           // nil: no worker hosts
	browser    func() string   // the browser URL with the token; nil until set
	rotate     func() error    // replaces the operator token; nil: not offered
	reload     Reloader        // rereads klbr.toml; nil: not offered
	log        *slog.Logger
	uid        uint32
	classify   func(pid int) string // placement.WorkerOf: a worker is not the operator

	// Limits are the control socket's timeouts and connection bound. It is a listener of
	// its own: a flood on the TCP port does not reach it.
	Limits httpguard.Limits
	// FollowLag is how long a tail --follow may leave a page unread before it is cut;
	// 0 means DefaultFollowLag.
	FollowLag time.Duration
}

// WithBrowser sets where the browser UI is, for `klbr-core open`; call it
// before serving.
func (s *Server) WithBrowser(url func() string) *Server {
	s.browser = url
	return s
}

// WithTokenRotation lets `klbr-core open --rotate` replace the operator
// token (POST /v1/browser/rotate): rotate writes a new token and makes the
// browser client use it, which signs every browser out.
func (s *Server) WithTokenRotation(rotate func() error) *Server {
	s.rotate = rotate
	return s
}

func (s *Server) handleRotate(w http.ResponseWriter, r *http.Request) {
	if s.rotate == nil || s.browser == nil {
		writeError(w, http.StatusServiceUnavailable, api.CodeUnavailable, "the browser UI is not serving yet")
		return
	}
	if err := s.rotate(); err != nil {
		s.fail(w, err)
		return
	}
	s.log.Info("operator token rotated from the control socket")
	writeJSON(w, http.StatusOK, api.Browser{URL: s.browser()})
}

func (s *Server) handleBrowser(w http.ResponseWriter, _ *http.Request) {
	if s.browser == nil {
		writeError(w, http.StatusServiceUnavailable, api.CodeUnavailable, "the browser UI is not serving yet")
		return
	}
	writeJSON(w, http.StatusOK, api.Browser{URL: s.browser()})
}

// New returns a Server.
func New(st *store.Store, admit *admission.Admitter, sessions *session.Manager, daemon Daemon, log *slog.Logger) *Server {
	return &Server{store: st, admit: admit, sessions: sessions, daemon: daemon, log: log, uid: uint32(os.Getuid()), classify: placement.WorkerOf,
		benchErr: errors.New("no workbench is configured")}
}

// WithWorkbench lets the API run cells; err, when set, says why it cannot.
func (s *Server) WithWorkbench(b Workbench, err error) *Server {
	s.bench, s.benchErr = b, err
	return s
}

// HTTPServer returns an http.Server for the control socket, recording each
// connection's peer credentials.
func (s *Server) HTTPServer() *http.Server {
	return httpguard.Apply(&http.Server{
		Handler:     s.Handler(),
		ConnContext: unixsock.ConnContextClassified(s.classify),
		ErrorLog:    slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}, s.Limits)
}

// Handler routes the API, behind the peer check.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/status", s.handleStatus)
	mux.HandleFunc("GET /v1/browser", s.handleBrowser)
	mux.HandleFunc("POST /v1/browser/rotate", s.handleRotate)
	mux.HandleFunc("GET /v1/sessions/{session}", s.handleSession)
	mux.HandleFunc("POST /v1/sessions/{session}/inputs", s.handleSend)
	mux.HandleFunc("GET /v1/sessions/{session}/records", s.handleRecords)
	mux.HandleFunc("POST /v1/sessions/{session}/drain", s.handleSessionDrain)
	mux.HandleFunc("POST /v1/sessions/{session}/stop", s.handleSessionMove(store.StateStopped, "stopped by operator"))
	mux.HandleFunc("POST /v1/sessions/{session}/start", s.handleSessionMove(store.StateReady, "started by operator"))
	mux.HandleFunc("POST /v1/sessions/{session}/exec", s.handleExec)
	mux.HandleFunc("POST /v1/sessions/{session}/reset", s.handleReset)
	s.routeHistory(mux)
	s.routeJobs(mux)
	s.routeHosts(mux)
	s.routeUsage(mux)
	s.routeSpend(mux)
	mux.HandleFunc("GET /v1/sessions/{session}/items", s.handleItems)
	mux.HandleFunc("POST /v1/items/{item}/mark", s.handleMark)
	mux.HandleFunc("GET /v1/held", s.handleHeld)
	mux.HandleFunc("POST /v1/held/{effect}/release", s.handleDecide(true))
	mux.HandleFunc("POST /v1/held/{effect}/drop", s.handleDecide(false))
	mux.HandleFunc("GET /v1/releases", s.handleReleases)
	mux.HandleFunc("GET /v1/releases/diff", s.handleReleaseDiff)
	mux.HandleFunc("POST /v1/releases", s.handlePublish)
	mux.HandleFunc("POST /v1/sessions/{session}/activate", s.handleActivate)
	mux.HandleFunc("POST /v1/sessions/{session}/rollback", s.handleRollback)
	mux.HandleFunc("POST /v1/sessions/{session}/hooks/replay", s.handleReplay)
	mux.HandleFunc("POST /v1/gc", s.handleGC)
	mux.HandleFunc("POST /v1/reload", s.handleReload)
	mux.HandleFunc("POST /v1/drain", s.handleShutdown(false))
	mux.HandleFunc("POST /v1/stop", s.handleShutdown(true))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, api.CodeNotFound, "no such operator API endpoint: "+r.Method+" "+r.URL.Path)
	})
	return s.checkPeer(mux)
}

// checkPeer admits only the daemon's own uid and root, and neither when the peer is a
// klbr worker or a descendant of one: a cell is not the operator.
func (s *Server) checkPeer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cred, ok := unixsock.FromContext(r.Context())
		if !ok || (cred.UID != s.uid && cred.UID != 0) {
			s.log.Warn("operator API: refused peer", "peer_uid", cred.UID, "peer_pid", cred.PID, "known", ok, "path", r.URL.Path)
			writeError(w, http.StatusForbidden, api.CodeForbidden, "the operator API serves only the daemon's user and root")
			return
		}
		if cred.Worker != "" {
			s.log.Warn("operator API: refused a worker", "peer_pid", cred.PID, "why", cred.Worker, "path", r.URL.Path)
			writeError(w, http.StatusForbidden, api.CodeForbidden, "the operator API does not serve klbr workers or their descendants (the peer is "+cred.Worker+"): a cell has no operator authority")
			return
		}
		next.ServeHTTP(w, r)
	})
}

func (s *Server) handleStatus(w http.ResponseWriter, r *http.Request) {
	st, err := s.daemon.Status(r.Context())
	if err != nil {
		s.fail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, st)
}

func (s *Server) handleSession(w http.ResponseWriter, r *http.Request) {
	st, err := s.daemon.Status(r.Context())
	if err != nil {
		s.fail(w, err)
		return
	}
	id := r.PathValue("session")
	for _, ss := range st.Sessions {
		if ss.ID == id {
			writeJSON(w, http.StatusOK, ss)
			return
		}
	}
	writeError(w, http.StatusNotFound, api.CodeNotFound, "unknown session "+strconv.Quote(id))
}

func (s *Server) handleSend(w http.ResponseWriter, r *http.Request) {
	var req api.SendRequest
	if !decodeRequest(w, r, &req) {
		return
	}
	in := admission.Input{
		Session: r.PathValue("session"), SourceKind: admission.SourceOperator, SourceKey: req.SourceKey,
		Conversation: "operator", Author: "operator", Body: req.Text, Maintenance: req.Maintenance,
	}
	if req.OccurredAt != nil {
		in.OccurredAt = *req.OccurredAt
	}
	// The commit does not depend on the client's socket: a client that half-closes after
	// a complete request (Go's server then cancels r.Context) still gets its input stored
	// and an answer with its id, never an empty 200.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), commitTimeout)
	defer cancel()
	got, err := s.admit.Admit(ctx, admission.DoorOperatorAPI, in)
	if err != nil {
		s.fail(w, err)
		return
	}
	status := http.StatusCreated
	if got.Duplicate {
		status = http.StatusOK
	}
	res := api.SendResponse{Session: in.Session, ID: got.InputID, EventID: got.EventID, Duplicate: got.Duplicate}
	if sess, err := s.store.Session(r.Context(), in.Session); err == nil {
		res.Unanswered = session.Unanswered(sess)
	}
	writeJSON(w, status, res)
}

func (s *Server) handleRecords(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("session")
	if _, err := s.store.Session(r.Context(), id); err != nil {
		s.fail(w, err)
		return
	}
	q := r.URL.Query()
	since, err := queryInt(q.Get("since"), 0)
	if ref, perr := store.ParseRef(q.Get("since")); err != nil && perr == nil && ref.Event != 0 {
		// A record's ref (e123, as tail and history show it): read what follows it.
		if since, err = s.store.SeqOfEvent(r.Context(), id, ref.Event); err != nil {
			s.historyFail(w, err)
			return
		}
	}
	if err != nil || since < 0 {
		writeError(w, http.StatusBadRequest, api.CodeInvalid, "since must be a record's ref (e123) or a non-negative integer cursor (seq)")
		return
	}
	// seq only grows, so a cursor past the last record did not come from this session:
	// an empty page or a silent follow would hide that until new records pass it.
	last, err := s.store.LastSeq(r.Context(), id)
	if err != nil {
		s.fail(w, err)
		return
	}
	if since > last {
		writeError(w, http.StatusConflict, api.CodeCursorPastEnd, fmt.Sprintf(
			"since %d is past the last record of session %s (seq %d): the cursor is from another data directory or a restored backup; read from 0, or from %d for new records only",
			since, id, last, last))
		return
	}
	limit, err := queryInt(q.Get("limit"), store.MaxRecordsPage)
	if err != nil || limit < 1 || limit > store.MaxRecordsPage {
		writeError(w, http.StatusBadRequest, api.CodeInvalid, "limit must be between 1 and "+strconv.Itoa(store.MaxRecordsPage))
		return
	}
	if q.Get("follow") != "1" && q.Get("follow") != "true" {
		recs, err := s.store.Records(r.Context(), id, since, int(limit))
		if err != nil {
			s.fail(w, err)
			return
		}
		writeJSON(w, http.StatusOK, api.Records{Records: recs, More: len(recs) == int(limit)})
		return
	}
	s.follow(w, r, id, since)
}

// Bounds of a follower: a page holds at most followPage records, and a client must take
// each page within FollowLag (Server.FollowLag), or it is cut: a tail --follow that stops
// reading holds one page, for a bounded time.
const (
	followPage       = 64
	DefaultFollowLag = 30 * time.Second
)

// follow streams records as JSON lines, from since on, until the client
// leaves, falls FollowLag behind, or the daemon shuts down.
func (s *Server) follow(w http.ResponseWriter, r *http.Request, id string, since int64) {
	wake, cancel := s.store.Watch(id) // before the first read, so no commit is missed
	defer cancel()
	lag := s.FollowLag
	if lag <= 0 {
		lag = DefaultFollowLag
	}
	rc := http.NewResponseController(w)
	flusher, _ := w.(http.Flusher)
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	if flusher != nil {
		flusher.Flush()
	}
	enc := json.NewEncoder(w)
	for {
		for {
			recs, err := s.store.Records(r.Context(), id, since, followPage)
			if err != nil {
				s.log.Warn("operator API: follow", "session", id, "error", err)
				return
			}
			rc.SetWriteDeadline(time.Now().Add(lag))
			for _, rec := range recs {
				if err := enc.Encode(rec); err != nil {
					s.log.Warn("operator API: follow cut: the client does not read", "session", id, "lag", lag, "error", err)
					return
				}
				since = rec.Seq
			}
			if err := rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
				s.log.Warn("operator API: follow cut: the client does not read", "session", id, "lag", lag, "error", err)
				return
			}
			rc.SetWriteDeadline(time.Time{})
			if len(recs) < followPage {
				break
			}
		}
		select {
		case <-wake:
		case <-r.Context().Done():
			return
		case <-s.daemon.Closing():
			return
		}
	}
}

// MaxExecTimeout bounds an operator cell.
const MaxExecTimeout = time.Hour

func (s *Server) handleExec(w http.ResponseWriter, r *http.Request) {
	var req api.ExecRequest
	if !decodeRequest(w, r, &req) {
		return
	}
	if s.bench == nil {
		writeError(w, http.StatusServiceUnavailable, api.CodeUnavailable, "cells cannot run: "+s.benchErr.Error())
		return
	}
	if req.Code == "" || len(req.Code) > admission.MaxBodyBytes {
		writeError(w, http.StatusBadRequest, api.CodeInvalid, fmt.Sprintf("code must be 1 to %d bytes", admission.MaxBodyBytes))
		return
	}
	timeout := time.Duration(req.TimeoutSeconds * float64(time.Second))
	if req.TimeoutSeconds == 0 {
		timeout = 60 * time.Second
	}
	if timeout <= 0 || timeout > MaxExecTimeout {
		writeError(w, http.StatusBadRequest, api.CodeInvalid, "timeout_seconds must be above 0 and at most 3600")
		return
	}
	id := r.PathValue("session")
	if _, err := s.store.Session(r.Context(), id); err != nil {
		s.fail(w, err)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), timeout)
	defer cancel()
	res, err := s.bench.Execute(ctx, id, req.Code, nil)
	if err != nil {
		s.fail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

func (s *Server) handleReset(w http.ResponseWriter, r *http.Request) {
	var req api.ResetRequest
	if r.ContentLength != 0 && !decodeRequest(w, r, &req) {
		return
	}
	id := r.PathValue("session")
	reason := "reset by operator"
	if req.Reason != "" {
		reason += ": " + req.Reason
	}
	if req.Kernel && s.bench == nil {
		writeError(w, http.StatusServiceUnavailable, api.CodeUnavailable, "cells cannot run: "+s.benchErr.Error())
		return
	}
	var epoch int64
	if err := s.store.Write(r.Context(), func(tx *store.Tx) (err error) {
		epoch, err = tx.ResetContext(id, reason)
		return err
	}); err != nil {
		s.fail(w, err)
		return
	}
	msg := fmt.Sprintf("the context was reset: epoch %d starts empty; the archive is kept and durable work continues", epoch)
	if req.Kernel {
		if err := s.bench.Reset(r.Context(), id, reason); err != nil {
			s.fail(w, err)
			return
		}
		msg += "; the workbench was reset (Python state was not restored, the next cell starts a new generation)"
	}
	writeJSON(w, http.StatusOK, api.Accepted{Accepted: true, Message: msg})
}

func (s *Server) handleSessionDrain(w http.ResponseWriter, r *http.Request) {
	sess, err := s.sessions.Drain(r.Context(), r.PathValue("session"))
	if err != nil {
		s.fail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, sess)
}

func (s *Server) handleSessionMove(to store.SessionState, reason string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		sess, err := s.sessions.Transition(r.Context(), r.PathValue("session"), to, reason)
		if err != nil {
			s.fail(w, err)
			return
		}
		writeJSON(w, http.StatusOK, sess)
	}
}

func (s *Server) handleShutdown(stop bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		msg := "draining: admission is closed; klbr-core exits once accepted work has finished"
		if stop {
			msg = "stopping: admission is closed and running work is interrupted; klbr-core exits next"
		}
		s.log.Info("operator API: shutdown requested", "stop", stop)
		writeJSON(w, http.StatusAccepted, api.Accepted{Accepted: true, Message: msg})
		s.daemon.Shutdown(stop)
	}
}

// fail maps a domain error to its HTTP answer.
func (s *Server) fail(w http.ResponseWriter, err error) {
	if status, code, ok := behaviorError(err); ok {
		writeError(w, status, code, err.Error())
		return
	}
	switch {
	case errors.Is(err, admission.ErrInvalid):
		writeError(w, http.StatusBadRequest, api.CodeInvalid, err.Error())
	case errors.Is(err, admission.ErrForbidden):
		writeError(w, http.StatusForbidden, api.CodeForbidden, err.Error())
	case errors.Is(err, store.ErrUnknownSession):
		writeError(w, http.StatusNotFound, api.CodeNotFound, err.Error())
	case errors.Is(err, admission.ErrDraining), errors.Is(err, workbench.ErrClosed):
		writeError(w, http.StatusServiceUnavailable, api.CodeDraining, err.Error())
	case errors.Is(err, session.ErrDraining), errors.Is(err, session.ErrStopped),
		errors.Is(err, store.ErrIllegalTransition), errors.Is(err, store.ErrStaleState):
		writeError(w, http.StatusConflict, api.CodeConflict, err.Error())
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		// Never an implicit 200: a request whose work did not happen says so, whatever the
		// client did with its socket.
		writeError(w, http.StatusServiceUnavailable, api.CodeUnavailable, "not done: the request ended before it completed ("+err.Error()+"); nothing was committed by it, retry with the same source key")
	default:
		s.log.Error("operator API: internal error", "error", err)
		writeError(w, http.StatusInternalServerError, api.CodeInternal, err.Error())
	}
}

func queryInt(v string, def int64) (int64, error) {
	if v == "" {
		return def, nil
	}
	return strconv.ParseInt(v, 10, 64)
}
