// Package workbench keeps each session's persistent Python workbench: it
// starts a worker generation when a cell needs one, journals every cell
// before it runs and its outcome after, records kernel resets, backs off
// restarts, and serves the cells' host requests that need no model
// (workspace.run).
package workbench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/klbr-dev/klbr/internal/artifacts"
	"github.com/klbr-dev/klbr/internal/behavior"
	"github.com/klbr-dev/klbr/internal/hosts"
	"github.com/klbr-dev/klbr/internal/kernel"
	"github.com/klbr-dev/klbr/internal/placement"
	"github.com/klbr-dev/klbr/internal/session"
	"github.com/klbr-dev/klbr/internal/store"
	"github.com/klbr-dev/klbr/internal/worker"
	"github.com/klbr-dev/klbr/internal/workspace"
)

// Config is what every session's workbench is made of.
type Config struct {
	Store       *store.Store
	Sessions    *session.Manager
	Kernel      string // klbr-kernel binary
	Python      string // resolved interpreter
	RuntimeSrc  string // materialized klbr-runtime src
	RuntimeHash string
	Workspace   string
	Placer      placement.Placer
	Limits      placement.Limits
	// Sandbox is what every worker and command of the workbench runs without (see
	// kernel.Sandbox): the daemon hides its data directory and, as root, drops the uid.
	Sandbox kernel.Sandbox
	// SandboxSummary says what Sandbox enforces here (doctor --verbose,
	// status --json); SandboxBrief in one short line (status, doctor).
	SandboxSummary string
	SandboxBrief   string
	Artifacts      *artifacts.Store
	Log            *slog.Logger
	// Observe, if set, is told of worker starts and resets (for metrics).
	Observe func(event string)

	// Remote, when set, runs the workbench of every root session (not a
	// child's) on a worker host: KLBR_REMOTE_PLACEMENT, [agent] host.
	Remote *Remote
	// Hosts, when set, reaches the worker hosts: a child spawned on one
	// (its place's Host) runs its generations there.
	Hosts *hosts.Engine

	// Workspaces, when set, says where each session works (a child's
	// worktree, a read-only workspace) and what its workers may write;
	// nil: every session works in Workspace under Sandbox.
	Workspaces *workspace.Workspaces
}

// SkillsFunc returns the skill set a new generation of session is offered
// under release ("": the session's active one), and the file holding it,
// which must stay readable while the generation lives.
type SkillsFunc func(ctx context.Context, session, release string) (set behavior.SkillSet, file string, err error)

// Result is a finished cell: its execution id and outcome.
type Result struct {
	Execution int64           `json:"execution"`
	Outcome   *worker.Outcome `json:"outcome"`
}

// ErrClosed is returned once the manager is shutting down.
var ErrClosed = errors.New("workbench is shutting down")

// Manager owns every session's workbench.
type Manager struct {
	cfg Config

	mu      sync.Mutex // guards benches, closed
	benches map[string]*bench
	closed  bool

	stopCtx context.Context // ends when the daemon stops: running cells are interrupted
	stopAll context.CancelFunc

	extMu   sync.Mutex                // guards ops, skills, crashed, present
	ops     map[string]worker.Handler // by op prefix ("behavior.", "hooks.", "local."): what commands does not answer
	skills  SkillsFunc
	crashed CrashFunc
	// present is result.present: the text the model is shown for an
	// outcome, and whether it differs from the host's rendering.
	present PresentFunc

	remoteMu sync.Mutex         // guards remotes
	remotes  map[string]*Remote // by host: children's workbenches there
}

// CrashFunc is told, off the cell's path, that a generation died unasked
// while running a cell pinned to pin (not an interrupt's reset).
type CrashFunc func(session string, pin store.Pin, reason string)

// SetCrashed installs who is told of crashes (the crash-loop fallback).
func (m *Manager) SetCrashed(f CrashFunc) {
	m.extMu.Lock()
	defer m.extMu.Unlock()
	m.crashed = f
}

// PresentFunc shapes how a finished cell's outcome is shown to the model.
type PresentFunc func(ctx context.Context, session string, pin store.Pin, out *worker.Outcome) (text string, changed bool)

// SetPresent installs result.present.
func (m *Manager) SetPresent(f PresentFunc) {
	m.extMu.Lock()
	defer m.extMu.Unlock()
	m.present = f
}

func (m *Manager) presenter() PresentFunc {
	m.extMu.Lock()
	defer m.extMu.Unlock()
	return m.present
}

// SetOps installs the handler of the requests whose op starts with prefix.
func (m *Manager) SetOps(prefix string, h worker.Handler) {
	m.extMu.Lock()
	defer m.extMu.Unlock()
	if m.ops == nil {
		m.ops = map[string]worker.Handler{}
	}
	m.ops[prefix] = h
}

// SetSkills installs how a new generation learns its skills.
func (m *Manager) SetSkills(f SkillsFunc) {
	m.extMu.Lock()
	defer m.extMu.Unlock()
	m.skills = f
}

func (m *Manager) ext() (map[string]worker.Handler, SkillsFunc) {
	m.extMu.Lock()
	defer m.extMu.Unlock()
	return m.ops, m.skills
}

// bench is one session's workbench. Its turn channel admits one cell at a time.
type bench struct {
	turn chan struct{} // buffered(1): holding the token means running a cell

	// resetReason, when set, retires the worker before the next cell: a
	// reset requested while a cell held the turn (an activation from a cell).
	// prepared, when set, is the generation that replaces it then: already
	// started and through its handshake (a prepared switch).
	resetMu     sync.Mutex
	resetReason string
	prepared    *worker.Worker

	// cancelCell interrupts the running cell (nil between cells); cell
	// describes it once it is journaled (nil before and between cells).
	cellMu     sync.Mutex // guards cancelCell, cell
	cancelCell context.CancelFunc
	cell       *RunningCell

	// Fields below are used only by the goroutine holding the turn token.
	w        *worker.Worker
	started  time.Time
	backoff  time.Duration
	notSoon  time.Time // no new generation before this
	commands int64
}

// New returns a Manager.
func New(cfg Config) *Manager {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Observe == nil {
		cfg.Observe = func(string) {}
	}
	stopCtx, stopAll := context.WithCancel(context.Background())
	return &Manager{cfg: cfg, benches: map[string]*bench{}, stopCtx: stopCtx, stopAll: stopAll}
}

// InterruptAll interrupts every running cell (daemon stop).
func (m *Manager) InterruptAll() { m.stopAll() }

// RunningCell is a journaled cell that has no outcome yet: what a drain
// waits for.
type RunningCell struct {
	Session   string
	Execution int64
	Started   time.Time
	Deadline  time.Time // its caller's deadline; zero when it has none
}

// Running lists the cells running now, by session.
func (m *Manager) Running() []RunningCell {
	m.mu.Lock()
	benches := make(map[string]*bench, len(m.benches))
	maps.Copy(benches, m.benches)
	m.mu.Unlock()
	var out []RunningCell
	for _, b := range benches {
		b.cellMu.Lock()
		if b.cell != nil {
			out = append(out, *b.cell)
		}
		b.cellMu.Unlock()
	}
	slices.SortFunc(out, func(a, b RunningCell) int { return strings.Compare(a.Session, b.Session) })
	return out
}

// Config returns what the manager was made with (the hook workers share it).
func (m *Manager) Config() Config { return m.cfg }

// Mode is the placement mode workers run under.
func (m *Manager) Mode() placement.Mode {
	if m.cfg.Placer == nil {
		return ""
	}
	return m.cfg.Placer.Mode()
}

func (m *Manager) bench(id string) (*bench, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, ErrClosed
	}
	b := m.benches[id]
	if b == nil {
		b = &bench{turn: make(chan struct{}, 1)}
		m.benches[id] = b
	}
	return b, nil
}

// take waits for the session's turn token.
func (b *bench) take(ctx context.Context) error {
	select {
	case b.turn <- struct{}{}:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("waiting for the running cell to finish: %w", ctx.Err())
	}
}

func (b *bench) give() { <-b.turn }

// takeInterrupting takes the turn token, interrupting each cell that holds
// it meanwhile (cooperatively first, then by a kernel reset, as any cell
// whose caller gives up).
func (b *bench) takeInterrupting(ctx context.Context) error {
	for {
		select {
		case b.turn <- struct{}{}:
			return nil
		default:
		}
		b.cellMu.Lock()
		if b.cancelCell != nil {
			b.cancelCell()
		}
		b.cellMu.Unlock()
		select {
		case b.turn <- struct{}{}:
			return nil
		case <-time.After(100 * time.Millisecond):
		case <-ctx.Done():
			return fmt.Errorf("waiting for the running cell to be interrupted: %w", ctx.Err())
		}
	}
}

// Execute runs code in session's workbench. The cell is journaled before it
// runs; its outcome is recorded before Execute returns. ctx's end interrupts
// the cell (cooperatively, then by a kernel reset). h answers host requests;
// nil serves workspace.run only.
func (m *Manager) Execute(ctx context.Context, sessionID, code string, h worker.Handler) (Result, error) {
	b, err := m.bench(sessionID)
	if err != nil {
		return Result{}, err
	}
	done, err := m.cfg.Sessions.Begin(sessionID)
	if err != nil {
		return Result{}, err
	}
	defer done()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(m.stopCtx, cancel)()
	if err := b.take(ctx); err != nil {
		return Result{}, err
	}
	defer b.give()
	b.cellMu.Lock()
	b.cancelCell = cancel
	b.cellMu.Unlock()
	defer func() {
		b.cellMu.Lock()
		b.cancelCell, b.cell = nil, nil
		b.cellMu.Unlock()
	}()

	w, err := m.ensureWorker(ctx, sessionID, b)
	if err != nil {
		return Result{}, err
	}
	var execID int64
	var pin store.Pin
	// Not cancelled with ctx: a write whose caller gave up may still
	// commit, and a journaled cell must then get its outcome (a cancelled
	// ctx interrupts it at once below), never stay running unanswered.
	if err := m.cfg.Store.Write(context.WithoutCancel(ctx), func(tx *store.Tx) (err error) {
		execID, pin, err = tx.StartExecution(sessionID, w.Generation(), code, cellCall(ctx))
		return err
	}); err != nil {
		return Result{}, err
	}
	deadline, _ := ctx.Deadline()
	b.cellMu.Lock()
	b.cell = &RunningCell{Session: sessionID, Execution: execID, Started: time.Now(), Deadline: deadline}
	b.cellMu.Unlock()
	ctx = withGeneration(withPin(ctx, pin), w.Generation())
	if h == nil {
		h = &commands{m: m, b: b, session: sessionID}
	}
	out, err := w.Execute(ctx, "x"+strconv.FormatInt(execID, 10), code, h)
	if err != nil {
		// The worker died between the check and the cell: nothing ran.
		out = &worker.Outcome{Execution: "x" + strconv.FormatInt(execID, 10), Generation: w.Generation(),
			Status: "error", Reset: true, Error: &worker.ErrorInfo{Type: "WorkerDied", Message: err.Error()}}
	}
	out.Presented = nil // the host's alone to set, never the worker's
	if present := m.presenter(); present != nil {
		// result.present, under the cell's behavior, before the outcome is
		// recorded: the model sees its text, the record keeps everything.
		if text, changed := present(ctx, sessionID, pin, out); changed {
			out.Presented = &text
		}
	}
	record, _ := json.Marshal(out)
	// The outcome is recorded even when the caller has gone: it happened.
	// While writes fail (a full disk) it is kept and retried, holding the
	// session's turn, so no later cell runs while this one is open.
	err = m.recordOutcome(ctx, func(tx *store.Tx) error {
		if err := tx.FinishExecution(sessionID, execID, out.Status, out.Reset, record); err != nil {
			return err
		}
		if out.Reset {
			return tx.KernelReset(sessionID, w.Generation(), out.Error.Message)
		}
		return nil
	})
	if out.Reset {
		if out.Error != nil && out.Error.Type == "WorkerDied" && m.remoteFor(sessionID) {
			m.cfg.Remote.noteLost(sessionID, w.Generation(), out.Error.Message)
		}
		m.retire(b, w)
		if out.Error != nil && out.Error.Type == "WorkerDied" {
			m.extMu.Lock()
			crashed := m.crashed
			m.extMu.Unlock()
			if crashed != nil {
				go crashed(sessionID, pin, out.Error.Message)
			}
		}
	}
	return Result{Execution: execID, Outcome: out}, err
}

// recordOutcome writes a finished cell's outcome, retrying with backoff
// while the storage fails, until it is written or the manager stops.
func (m *Manager) recordOutcome(ctx context.Context, fn func(*store.Tx) error) error {
	wait := 100 * time.Millisecond
	for {
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		err := m.cfg.Store.Write(wctx, fn)
		cancel()
		if !errors.Is(err, store.ErrStorage) {
			return err
		}
		m.cfg.Log.Warn("a cell's outcome cannot be written yet; it is kept and retried", "retry_in", wait, "error", err)
		t := time.NewTimer(wait)
		select {
		case <-m.stopCtx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		wait = min(2*wait, 10*time.Second)
	}
}

// ensureWorker returns the session's live worker, starting a new generation
// if there is none, no sooner than the restart backoff allows.
func (m *Manager) ensureWorker(ctx context.Context, sessionID string, b *bench) (*worker.Worker, error) {
	b.resetMu.Lock()
	reason, prepared := b.resetReason, b.prepared
	b.resetReason, b.prepared = "", nil
	b.resetMu.Unlock()
	if reason != "" && b.w != nil {
		gen := b.w.Generation()
		b.w.Kill()
		b.w = nil
		m.cfg.Observe("reset")
		if err := m.cfg.Store.Write(ctx, func(tx *store.Tx) error { return tx.KernelReset(sessionID, gen, reason) }); err != nil {
			if prepared != nil {
				prepared.Kill()
			}
			return nil, err
		}
	}
	if prepared != nil {
		select {
		case <-prepared.Dead():
			// Died while it waited: a fresh generation starts below.
			m.cfg.Store.Write(context.WithoutCancel(ctx), func(tx *store.Tx) error {
				return tx.KernelReset(sessionID, prepared.Generation(), "the prepared generation died before its first cell")
			})
		default:
			b.w, b.started = prepared, time.Now()
			return prepared, nil
		}
	}
	if b.w != nil {
		select {
		case <-b.w.Dead():
			if m.remoteFor(sessionID) {
				// A remote worker dies between cells when its connection
				// did not return within the host's down grace: its Python
				// state is gone, and the session is told so before the
				// next cell runs.
				if err := m.remoteLost(ctx, sessionID, b.w); err != nil {
					return nil, err
				}
			}
			m.retire(b, b.w)
		default:
			return b.w, nil
		}
	}
	if wait := time.Until(b.notSoon); wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return nil, fmt.Errorf("the workbench restarts in %s (backing off after failures): %w", wait.Round(time.Millisecond), ctx.Err())
		}
	}
	w, err := m.startGeneration(ctx, sessionID, "")
	if err != nil {
		m.fail(b)
		return nil, err
	}
	b.w, b.started = w, time.Now()
	return w, nil
}

// startGeneration starts a new workbench generation of session under
// release ("": its active one) and waits for its handshake.
func (m *Manager) startGeneration(ctx context.Context, sessionID, release string) (*worker.Worker, error) {
	var gen int64
	details := map[string]any{"placement": string(m.Mode()), "runtime": m.cfg.RuntimeHash, "python": m.cfg.Python}
	var env []string
	var skillsRev string
	if _, skills := m.ext(); skills != nil {
		set, file, err := skills(ctx, sessionID, release)
		if err != nil {
			return nil, fmt.Errorf("skills: %w", err)
		}
		env = append(env, "KLBR_SKILLS_FILE="+file)
		// klbr_skills: importable in every cell of this generation, from
		// the copy staged for its release and managed skills; then the
		// release's own dependency environment, staged before activation.
		path := m.cfg.RuntimeSrc
		for _, p := range []string{set.Path, set.Site} {
			if p != "" {
				path += string(os.PathListSeparator) + p
			}
		}
		if path != m.cfg.RuntimeSrc {
			env = append(env, "PYTHONPATH="+path)
		}
		skillsRev = set.Revision
		details["skills_revision"] = set.Revision
		details["skills"] = len(set.Skills)
		details["skills_refused"] = set.Refused
		details["skill_modules"] = len(set.Modules)
	}
	if err := m.cfg.Store.Write(ctx, func(tx *store.Tx) (err error) {
		gen, err = tx.NextKernelGeneration(sessionID, details)
		return err
	}); err != nil {
		return nil, err
	}
	spec := worker.Spec{
		Role: worker.RoleWorkbench, Session: sessionID, Generation: gen,
		Kernel: m.cfg.Kernel, Python: m.cfg.Python, RuntimeSrc: m.cfg.RuntimeSrc,
		Placer: m.cfg.Placer, Limits: m.cfg.Limits, Artifacts: m.cfg.Artifacts,
		Skills: skillsRev, Env: env, Log: m.cfg.Log,
	}
	var err error
	if m.remoteFor(sessionID) {
		err = m.cfg.Remote.prepare(ctx, &spec, m.cfg.RuntimeSrc, "")
	} else if p, onHost, perr := m.hostPlace(ctx, sessionID); perr != nil {
		err = perr
	} else if onHost {
		// A child on a worker host: its generation runs there, in its
		// copy of the workspace.
		var r *Remote
		if r, err = m.remoteOn(p.Host); err == nil {
			err = r.prepare(ctx, &spec, m.cfg.RuntimeSrc, p.Dir)
		}
	} else {
		spec.Workspace, spec.Sandbox, err = m.Place(ctx, sessionID)
	}
	if err != nil {
		m.cfg.Store.Write(context.WithoutCancel(ctx), func(tx *store.Tx) error {
			return tx.KernelReset(sessionID, gen, "the workbench failed to start: "+err.Error())
		})
		return nil, err
	}
	w, err := worker.Start(ctx, spec)
	if err != nil {
		m.cfg.Observe("start_failed")
		m.cfg.Store.Write(context.WithoutCancel(ctx), func(tx *store.Tx) error {
			return tx.KernelReset(sessionID, gen, "the workbench failed to start: "+err.Error())
		})
		return nil, fmt.Errorf("start workbench generation %d: %w", gen, err)
	}
	m.cfg.Observe("started")
	return w, nil
}

// Place is where session's cells and commands work and the sandbox they
// run under there: its own workspace directory (a child's worktree, a
// read-only workspace) when Workspaces says so, else Workspace.
func (m *Manager) Place(ctx context.Context, sessionID string) (dir string, sb kernel.Sandbox, err error) {
	if m.cfg.Workspaces == nil {
		return m.cfg.Workspace, m.cfg.Sandbox, nil
	}
	p, err := m.cfg.Workspaces.For(ctx, sessionID)
	if err != nil {
		return "", kernel.Sandbox{}, err
	}
	if p.Host != "" {
		return "", kernel.Sandbox{}, fmt.Errorf("%s works in a copy on host %s, and klbr-core's machine has none of it: "+
			"run the command in a cell (subprocess) or with jobs.run, which run on that host", sessionID, p.Host)
	}
	return p.Dir, m.cfg.Workspaces.SandboxFor(p), nil
}

// Prepare starts the generation that is to replace session's workbench
// under release, through its handshake, while the current one keeps
// serving. It replaces the current one at its next safe boundary: before
// the next cell, or at Switch when no cell runs. If it cannot start, nothing
// changes and the error says why.
func (m *Manager) Prepare(ctx context.Context, sessionID, release, reason string) error {
	b, err := m.bench(sessionID)
	if err != nil {
		return err
	}
	w, err := m.startGeneration(ctx, sessionID, release)
	if err != nil {
		return err
	}
	b.resetMu.Lock()
	old := b.prepared
	b.prepared, b.resetReason = w, reason
	b.resetMu.Unlock()
	if old != nil {
		old.Kill()
	}
	return nil
}

// Switch makes a prepared generation take over now when no cell runs (the
// old one stops at once); otherwise the running cell's end is the boundary.
func (m *Manager) Switch(ctx context.Context, sessionID string) error {
	b, err := m.bench(sessionID)
	if err != nil {
		return err
	}
	select {
	case b.turn <- struct{}{}:
		defer b.give()
		_, err := m.ensureWorker(ctx, sessionID, b)
		return err
	default:
		return nil
	}
}

// Discard drops a prepared generation that is not to be used (its
// activation lost the compare-and-swap), recording why.
func (m *Manager) Discard(sessionID, reason string) {
	b, err := m.bench(sessionID)
	if err != nil {
		return
	}
	b.resetMu.Lock()
	w := b.prepared
	b.prepared, b.resetReason = nil, ""
	b.resetMu.Unlock()
	if w != nil {
		w.Kill()
		m.cfg.Store.Write(context.Background(), func(tx *store.Tx) error { return tx.KernelReset(sessionID, w.Generation(), reason) })
	}
}

// retire drops a dead or killed worker and sets the backoff for the next.
func (m *Manager) retire(b *bench, w *worker.Worker) {
	w.Kill()
	m.cfg.Observe("reset")
	if time.Since(b.started) < time.Minute {
		m.fail(b)
	} else {
		b.backoff = 0
	}
	b.w = nil
}

// fail doubles the restart backoff: 0.5 s up to 30 s.
func (m *Manager) fail(b *bench) {
	switch {
	case b.backoff == 0:
		b.backoff = 500 * time.Millisecond
	case b.backoff < 30*time.Second:
		b.backoff = min(2*b.backoff, 30*time.Second)
	}
	b.notSoon = time.Now().Add(b.backoff)
}

// Reset kills the session's workbench (if any) and records that its Python
// state is gone; the next cell starts a fresh generation. A cell that is
// running is interrupted first (the operator's reset never waits on it).
func (m *Manager) Reset(ctx context.Context, sessionID, reason string) error {
	return m.reset(ctx, sessionID, reason, true)
}

// ResetAfterCell is Reset that lets a running cell end first (an ended
// child agent's kernel: the cell that called agents.finish ends by itself).
func (m *Manager) ResetAfterCell(ctx context.Context, sessionID, reason string) error {
	return m.reset(ctx, sessionID, reason, false)
}

func (m *Manager) reset(ctx context.Context, sessionID, reason string, interrupt bool) error {
	if _, err := m.cfg.Store.Session(ctx, sessionID); err != nil {
		return err
	}
	b, err := m.bench(sessionID)
	if err != nil {
		return err
	}
	if interrupt {
		err = b.takeInterrupting(ctx)
	} else {
		err = b.take(ctx)
	}
	if err != nil {
		return err
	}
	defer b.give()
	if b.w == nil {
		return nil
	}
	gen := b.w.Generation()
	b.w.Kill()
	b.w = nil
	b.backoff, b.notSoon = 0, time.Time{}
	m.cfg.Observe("reset")
	return m.cfg.Store.Write(ctx, func(tx *store.Tx) error { return tx.KernelReset(sessionID, gen, reason) })
}

// ResetAtBoundary asks for session's workbench to be replaced before its
// next cell, without waiting: the safe boundary of an activation that a
// running cell (maybe the caller itself) requested.
func (m *Manager) ResetAtBoundary(sessionID, reason string) {
	b, err := m.bench(sessionID)
	if err != nil {
		return
	}
	b.resetMu.Lock()
	b.resetReason = reason
	b.resetMu.Unlock()
}

// Close stops every workbench and waits, bounded, until their trees are gone
// and their placements released.
func (m *Manager) Close() {
	m.stopAll()
	m.mu.Lock()
	m.closed = true
	benches := m.benches
	m.mu.Unlock()
	var stopped []*worker.Worker
	for _, b := range benches {
		b.resetMu.Lock()
		if b.prepared != nil {
			b.prepared.Stop()
			stopped = append(stopped, b.prepared)
			b.prepared = nil
		}
		b.resetMu.Unlock()
		select {
		case b.turn <- struct{}{}:
			if b.w != nil {
				b.w.Stop()
				stopped = append(stopped, b.w)
			}
			<-b.turn
		default:
			// A cell is still running: stopAll has interrupted it, and its
			// Execute retires the worker if the interrupt escalates.
		}
	}
	worker.WaitDone(stopped, 5*time.Second)
}
