package web

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/klbr-dev/klbr/internal/activation"
	"github.com/klbr-dev/klbr/internal/api"
	"github.com/klbr-dev/klbr/internal/behavior"
	"github.com/klbr-dev/klbr/internal/celltree"
	"github.com/klbr-dev/klbr/internal/history"
	"github.com/klbr-dev/klbr/internal/localapi"
	"github.com/klbr-dev/klbr/internal/session"
	"github.com/klbr-dev/klbr/internal/store"
	"github.com/klbr-dev/klbr/internal/workbench"
)

// The operator controls of the browser (docs/browser.md). They call the
// same domain operations as the operator API (package localapi), so they
// work when the model or the hooks are broken.

// Workbench is the part of the workbench manager the browser needs
// (*workbench.Manager implements it).
type Workbench interface {
	// Reset replaces the session's Python kernel; its state is not restored.
	Reset(ctx context.Context, session, reason string) error
}

// Jobs is the part of the jobs manager the browser needs (*jobs.Manager
// implements it).
type Jobs interface {
	// Cancel cancels job id (a child agent's with its descendants).
	Cancel(ctx context.Context, id int64) (store.Job, error)
}

// Behavior is the part of the activation service the browser needs
// (*activation.Service implements it).
type Behavior interface {
	// Publish records a release stored by behavior.Releases.Publish.
	Publish(ctx context.Context, m behavior.Manifest) error
	// Activate makes release the session's behavior if it is still at
	// epoch parent; a refused candidate changes nothing.
	Activate(ctx context.Context, session string, parent int64, release, reason string) (activation.Result, error)
	// Rollback returns the session to the release before the active one.
	Rollback(ctx context.Context, session string) (activation.Result, error)
}

// SoulFile is the soul's file in a behavior tree.
const SoulFile = "soul.md"

// controlTimeout bounds one control. Controls run detached from the socket:
// an operator who closes the tab does not abort a reset or an activation
// half way.
const controlTimeout = 5 * time.Minute

// control runs a control message for the connected session id and answers.
func (c *client) control(ctx context.Context, id string, m ClientMessage) bool {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), controlTimeout)
	defer cancel()
	b := c.b
	fail := func(err error) bool {
		code := controlErrorCode(err)
		if code == api.CodeInternal {
			b.log.Error("browser: control failed", "action", m.Type, "session", id, "error", err)
		}
		return c.send(errorMsg{Type: MsgError, Code: code, Message: err.Error(), Action: m.Type})
	}
	unavailable := func(what string) bool {
		return c.send(errorMsg{Type: MsgError, Code: api.CodeUnavailable, Message: what + " is unavailable in this daemon", Action: m.Type})
	}
	b.log.Info("browser: control", "action", m.Type, "session", id)
	switch m.Type {
	case MsgReset:
		// As the operator API's reset (klbr-core reset [--kernel]): a new
		// context epoch, the archive kept; with kernel, a new workbench too.
		target := id
		if m.Session != "" {
			target = m.Session
		}
		if m.Kernel && b.Workbench == nil {
			return unavailable("the workbench (cells cannot run)")
		}
		const reason = "reset from the browser"
		var epoch int64
		if err := b.Store.Write(ctx, func(tx *store.Tx) (err error) {
			epoch, err = tx.ResetContext(target, reason)
			return err
		}); err != nil {
			return fail(err)
		}
		msg := fmt.Sprintf("the context was reset: epoch %d starts empty; the archive is kept and durable work continues", epoch)
		if m.Kernel {
			if err := b.Workbench.Reset(ctx, target, reason); err != nil {
				return fail(fmt.Errorf("%s; the workbench reset failed: %w", msg, err))
			}
			msg += "; the workbench was reset (Python state was not restored, the next cell starts a new generation)"
		}
		return c.send(ackMsg{Type: MsgAck, Action: m.Type, Session: target, Message: msg})
	case MsgJobCancel:
		// As klbr-core jobs cancel N: any job of the daemon (the operator's
		// authority), a child agent's job cancels the child and its tree.
		if b.Jobs == nil {
			return unavailable("jobs")
		}
		j, err := b.Jobs.Cancel(ctx, m.Job)
		if err != nil {
			return fail(err)
		}
		return c.send(ackMsg{Type: MsgAck, Action: m.Type, Session: j.Session, Message: fmt.Sprintf("job %d is %s", j.ID, j.State)})
	case MsgSpendCap:
		// As klbr-core spend cap daily|monthly X: kept in the store and
		// applied at once; sessions held at the cap look again.
		if b.Spend == nil {
			return unavailable("spend caps (the agent does not run)")
		}
		if err := b.Spend.SetSpendCap(ctx, m.Cap, m.USD); err != nil {
			return fail(err)
		}
		return c.send(ackMsg{Type: MsgAck, Action: m.Type, Session: id, Message: fmt.Sprintf("the %s spend cap is now %.2f USD", m.Cap, m.USD)})
	case MsgCompact:
		if b.Compact == nil {
			return unavailable("compaction")
		}
		res, err := b.Compact(ctx, id)
		if err != nil {
			return fail(err)
		}
		return c.send(ackMsg{Type: MsgAck, Action: m.Type, Session: id, Message: res.Message})
	case MsgSessionDrain, MsgSessionStop, MsgSessionPause, MsgSessionStart:
		if b.Sessions == nil {
			return unavailable("the session manager")
		}
		var (
			sess store.Session
			err  error
			msg  string
		)
		switch m.Type {
		case MsgSessionDrain:
			sess, err = b.Sessions.Drain(ctx, id)
			msg = "the session is draining: it finishes accepted work and admits no more"
		case MsgSessionStop:
			sess, err = b.Sessions.Transition(ctx, id, store.StateStopped, "stopped from the browser")
			msg = "the session is stopped"
		case MsgSessionPause:
			// The turn loop watches the session: a paused session's running
			// model request or cell is cut off and recorded as interrupted.
			sess, err = b.Sessions.Transition(ctx, id, store.StatePaused, "paused by the operator from the browser")
			msg = "the session is paused: running work is interrupted; Start resumes it"
		default:
			sess, err = b.Sessions.Transition(ctx, id, store.StateReady, "started from the browser")
			msg = "the session is ready"
		}
		if err != nil {
			return fail(err)
		}
		return c.send(ackMsg{Type: MsgAck, Action: m.Type, Session: id, Message: msg, State: &sess})
	case MsgActivate:
		if b.Behavior == nil || b.Releases == nil {
			return unavailable("behavior releases")
		}
		rel, err := b.Releases.Resolve(m.Release)
		if err != nil {
			return c.send(errorMsg{Type: MsgError, Code: api.CodeInvalid, Message: err.Error(), Action: m.Type})
		}
		res, err := b.Behavior.Activate(ctx, id, *m.ExpectedEpoch, rel, "activated from the browser")
		if err != nil {
			return fail(err)
		}
		return c.send(activatedMsg{Type: MsgActivated, Action: m.Type, Result: res})
	case MsgRollback:
		if b.Behavior == nil {
			return unavailable("behavior releases")
		}
		res, err := b.Behavior.Rollback(ctx, id)
		if err != nil {
			return fail(err)
		}
		return c.send(activatedMsg{Type: MsgActivated, Action: m.Type, Result: res})
	case MsgEditSoul:
		if b.Behavior == nil || b.Releases == nil {
			return unavailable("behavior releases")
		}
		res, err := b.editSoul(ctx, id, m.Text, *m.ExpectedEpoch)
		if err != nil {
			return fail(err)
		}
		return c.send(activatedMsg{Type: MsgActivated, Action: m.Type, Result: res})
	}
	return true
}

// editSoul publishes the session's active release with a new soul and
// activates it against expected: a prompt-only activation through the
// revision path.
func (b *browser) editSoul(ctx context.Context, id, text string, expected int64) (activation.Result, error) {
	sess, err := b.Store.Session(ctx, id)
	if err != nil {
		return activation.Result{}, err
	}
	if sess.PolicyRevision == "" {
		return activation.Result{}, fmt.Errorf("%w: session %s has no active release to edit", errNoRelease, id)
	}
	if sess.BehaviorEpoch != expected {
		// Checked again, atomically, by the activation; this only saves a publish.
		return activation.Result{}, fmt.Errorf("%w: session %s is at epoch %d, not %d", store.ErrStaleEpoch, id, sess.BehaviorEpoch, expected)
	}
	tmp, err := os.MkdirTemp("", "klbr-soul-")
	if err != nil {
		return activation.Result{}, err
	}
	defer os.RemoveAll(tmp)
	tree := filepath.Join(tmp, "tree")
	if _, err := celltree.Copy(b.Releases.Tree(sess.PolicyRevision), tree, celltree.Options{Writable: true,
		MaxEntries: 2 * behavior.MaxTreeFiles, MaxBytes: behavior.MaxTreeBytes}); err != nil {
		return activation.Result{}, fmt.Errorf("copy release %s: %w", sess.PolicyRevision, err)
	}
	if err := os.WriteFile(filepath.Join(tree, SoulFile), []byte(text), 0o644); err != nil {
		return activation.Result{}, err
	}
	m, err := b.Releases.Publish(os.DirFS(tree))
	if err != nil {
		return activation.Result{}, err
	}
	if err := b.Behavior.Publish(ctx, m); err != nil {
		return activation.Result{}, err
	}
	return b.Behavior.Activate(ctx, id, expected, m.ID, "soul edited from the browser")
}

var errNoRelease = errors.New("no active release")

// controlErrorCode maps a control's error to its code.
func controlErrorCode(err error) string {
	switch {
	case errors.Is(err, store.ErrStaleEpoch), errors.Is(err, store.ErrIllegalTransition), errors.Is(err, store.ErrStaleState):
		return api.CodeConflict
	case errors.Is(err, activation.ErrCandidate), errors.Is(err, behavior.ErrCorrupt), errors.Is(err, behavior.ErrInvalidTree):
		return api.CodeRefused
	case errors.Is(err, workbench.ErrClosed):
		return api.CodeDraining
	case errors.Is(err, errNoRelease):
		return api.CodeConflict
	case errors.Is(err, session.ErrDraining), errors.Is(err, session.ErrStopped), errors.Is(err, history.ErrNothingToCompact):
		return api.CodeConflict
	case errors.Is(err, history.ErrUnavailable):
		return api.CodeUnavailable
	case errors.Is(err, store.ErrNoJob):
		return api.CodeNotFound
	case errors.Is(err, store.ErrJobState):
		return api.CodeConflict
	case errors.Is(err, localapi.ErrInvalidCap):
		return api.CodeInvalid
	}
	return errorCode(err)
}

// soulMsg is GET /v2/soul's answer.
type soulMsg struct {
	Session string `json:"session"`
	Epoch   int64  `json:"epoch"`
	Release string `json:"release"`
	Text    string `json:"text"`
	Exists  bool   `json:"exists"` // false when the release has no soul.md
}

// handleSoul serves the connected session's active soul and epoch:
// GET /v2/soul?session=S (default "default").
func (b *browser) handleSoul(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	jsonErr := func(status int, code, msg string) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		json.NewEncoder(w).Encode(map[string]string{"code": code, "error": msg})
	}
	if b.Releases == nil {
		jsonErr(http.StatusServiceUnavailable, api.CodeUnavailable, "behavior releases are unavailable in this daemon")
		return
	}
	id := r.URL.Query().Get("session")
	if id == "" {
		id = "default"
	}
	if !session.ValidID(id) {
		jsonErr(http.StatusBadRequest, api.CodeInvalid, "bad session name")
		return
	}
	sess, err := b.Store.Session(r.Context(), id)
	if err != nil {
		if errors.Is(err, store.ErrUnknownSession) {
			jsonErr(http.StatusNotFound, api.CodeNotFound, err.Error())
			return
		}
		jsonErr(http.StatusInternalServerError, api.CodeInternal, err.Error())
		return
	}
	out := soulMsg{Session: id, Epoch: sess.BehaviorEpoch, Release: sess.PolicyRevision}
	if sess.PolicyRevision != "" {
		text, err := os.ReadFile(filepath.Join(b.Releases.Tree(sess.PolicyRevision), SoulFile))
		switch {
		case err == nil:
			out.Text, out.Exists = string(text), true
		case errors.Is(err, fs.ErrNotExist):
		default:
			jsonErr(http.StatusInternalServerError, api.CodeInternal, err.Error())
			return
		}
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(out)
}

// handleArtifact serves stored content, GET /v2/artifacts/{sha256}, as
// plain text the browser never sniffs.
func (b *browser) handleArtifact(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if b.Artifacts == nil {
		http.Error(w, "artifacts are unavailable in this daemon", http.StatusServiceUnavailable)
		return
	}
	p, err := b.Artifacts.Path(r.PathValue("sha256"))
	if err != nil {
		http.Error(w, "not a sha256 hex digest", http.StatusBadRequest)
		return
	}
	f, err := os.Open(p)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			http.Error(w, "no such artifact", http.StatusNotFound)
			return
		}
		b.log.Warn("browser: open artifact", "error", err)
		http.Error(w, "reading the artifact failed", http.StatusInternalServerError)
		return
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil || !st.Mode().IsRegular() {
		http.Error(w, "no such artifact", http.StatusNotFound)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("Content-Security-Policy", "default-src 'none'; sandbox")
	h.Set("Content-Disposition", "inline")
	// ServeContent handles Range and HEAD; the content is immutable.
	http.ServeContent(w, r, "", st.ModTime(), f)
}
