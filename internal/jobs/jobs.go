// Package jobs runs durable jobs: tracked commands that outlive the cell and
// the kernel that started them, scheduled routines (an importable
// "module:function" of a behavior release, called with JSON input in a fresh
// worker pinned to that release), and sources (routines that admit outside
// events with source authority). Every job is a row of the store; its state
// moves only by the transitions below, which the store enforces as well. One
// timer, armed for the earliest deadline, drives every schedule. A job's end
// commits its result and one notification input to its owning session in one
// transaction. After a restart, a job found running is reconciled by its
// recovery policy; a command is never rerun silently.
package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/klbr-dev/klbr/internal/artifacts"
	"github.com/klbr-dev/klbr/internal/hosts"
	"github.com/klbr-dev/klbr/internal/kernel"
	"github.com/klbr-dev/klbr/internal/placement"
	"github.com/klbr-dev/klbr/internal/store"
	"github.com/klbr-dev/klbr/internal/workspace"
)

// Kinds.
const (
	KindCommand = "command"
	KindRoutine = "routine"
	KindSource  = "source"
	KindChild   = "child" // child agents: their sessions run in the turn loop (package agents)
)

// Recovery policies: what a restart does with a job it finds running.
const (
	RetrySafe = "retry_safe" // start it again
	Resume    = "resume"     // start it again from its last checkpoint
	Manual    = "manual"     // mark it unknown and tell the owner
)

// transitions is the job lifecycle. The schema enforces the same table
// (migration 0013, trigger jobs_transitions); a test keeps them equal.
var transitions = map[store.JobState][]store.JobState{
	store.JobPending: {store.JobRunning, store.JobCancelled},
	store.JobRunning: {store.JobPending, store.JobSucceeded, store.JobFailed, store.JobCancelled, store.JobUnknown},
}

// CheckTransition reports whether a job may move from one state to another.
func CheckTransition(from, to store.JobState) error {
	if !slices.Contains(transitions[from], to) {
		return fmt.Errorf("%w: %s → %s", store.ErrJobState, from, to)
	}
	return nil
}

// Bounds of what a cell may ask for.
const (
	MaxArgv        = 256
	MaxArgBytes    = 64 << 10
	MaxInputBytes  = 64 << 10 // a routine's input, a checkpoint, a cursor, a result
	MaxEntryLen    = 200
	MaxEmitEvents  = 100
	MaxEventBytes  = 16 << 10
	MaxEventKeyLen = 200
)

// Config is what jobs run with.
type Config struct {
	Store     *store.Store
	Artifacts *artifacts.Store
	// Worker parts, as the workbench has them.
	Kernel     string
	Python     string
	RuntimeSrc string
	Workspace  string
	// Workspaces, when set, says where each session's jobs work (a
	// child's worktree, a read-only workspace) and under which sandbox.
	Workspaces *workspace.Workspaces
	Placer     placement.Placer
	Limits     placement.Limits // each job's scope: memory, tasks, CPU
	Sandbox    kernel.Sandbox
	// Tree returns the directory of a behavior release's tree (klbr_skills/, klbr_hooks/).
	Tree func(release string) string

	// Hosts reaches the worker hosts of [hosts.NAME]; nil: none, and a job
	// that names a host is refused.
	Hosts *hosts.Engine
	// HostPoll is how often a running remote job's unit is asked for its
	// state; 0 means 1 s.
	HostPoll time.Duration

	// MaxConcurrent bounds the jobs running at once; 0 means 4.
	MaxConcurrent int
	// MaxWall bounds each run's wall time; 0 means 24 h. A command's own
	// timeout (default 1 h) is at most this.
	MaxWall time.Duration
	// MaxOutput bounds the bytes of a command's output kept in its artifact; 0 means 16 MiB.
	MaxOutput int64
	// PreviewBytes bounds the output tail stored on the job; 0 means 2000.
	PreviewBytes int

	// Plan is the job.plan decision (admission and priority); nil admits at priority 0.
	Plan func(ctx context.Context, session string, in PlanInput) Plan

	Clock func() time.Time
	Log   *slog.Logger
}

// PlanInput is what job.plan decides on.
type PlanInput struct {
	Kind     string          `json:"kind"`
	Spec     json.RawMessage `json:"spec"`
	Schedule json.RawMessage `json:"schedule,omitempty"`
	Recovery string          `json:"recovery"`
	Running  int             `json:"running"` // jobs running now
}

// Plan is job.plan's answer.
type Plan struct {
	Admit    bool   `json:"admit"`
	Priority int    `json:"priority"`
	Reason   string `json:"reason"`
	// Host, when set, is the worker host job.plan sends the job to: a
	// [hosts.NAME] or "label:L", in place of the one it asked for (or
	// none). nil leaves the job where it asked to run.
	Host *string `json:"host,omitempty"`
}

// ErrRefused wraps a job.plan refusal.
var ErrRefused = errors.New("job refused")

// ErrClosed is returned once the manager is shutting down.
var ErrClosed = errors.New("jobs are shutting down")

// Manager owns every running job and the one timer.
type Manager struct {
	cfg Config

	mu      sync.Mutex // guards running, waiters, closed, armed
	running map[int64]*run
	waiters map[int64][]chan struct{}
	closed  bool
	armed   time.Time // the timer's deadline; zero when none

	slots   chan struct{} // one token per running job
	kick    chan struct{} // buffered(1): the earliest deadline may have changed, or a slot freed
	stop    chan struct{}
	done    chan struct{}
	wg      sync.WaitGroup
	wakeups atomic.Int64 // scheduler wake-ups (timer fires and kicks)
	gen     atomic.Int64
	started atomic.Bool

	// cancelChild cancels a running child agent (package agents); nil: none run.
	cancelChild func(ctx context.Context, j store.Job) (store.Job, error)

	// trees are what routines on hosts take there, packed once.
	trees trees

	// orphans are remote commands found running at start, reattached by Start.
	orphans []store.Job

	// execHook, when set (benchmarks), runs instead of a job's real run.
	execHook func(ctx context.Context, j store.Job, due time.Time) *store.JobEnd
}

type run struct {
	job       store.Job
	cancel    context.CancelFunc
	cancelled atomic.Bool // by the owner or the operator
	// inputsSkipped lists what of a command's inputs was left out.
	inputsSkipped []string
	// after, when set, runs once the run's end is recorded (a remote
	// unit's collection).
	after func()
}

// New returns a Manager; Start recovers and starts the timer.
func New(cfg Config) *Manager {
	if cfg.MaxConcurrent <= 0 {
		cfg.MaxConcurrent = 4
	}
	if cfg.MaxWall <= 0 {
		cfg.MaxWall = 24 * time.Hour
	}
	if cfg.MaxOutput <= 0 {
		cfg.MaxOutput = 16 << 20
	}
	if cfg.PreviewBytes <= 0 {
		cfg.PreviewBytes = 2000
	}
	if cfg.HostPoll <= 0 {
		cfg.HostPoll = time.Second
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Manager{cfg: cfg, running: map[int64]*run{}, waiters: map[int64][]chan struct{}{},
		slots: make(chan struct{}, cfg.MaxConcurrent), kick: make(chan struct{}, 1),
		stop: make(chan struct{}), done: make(chan struct{})}
}

// Start reconciles the jobs a previous run left running, then starts the timer.
func (m *Manager) Start(ctx context.Context) error {
	if err := m.recover(ctx); err != nil {
		return err
	}
	// No local job runs yet: the own directories a previous run left go.
	if err := os.RemoveAll(m.jobsDir()); err != nil {
		m.cfg.Log.Warn("jobs: remove the jobs' directories", "error", err)
	}
	m.gen.Store(m.cfg.Clock().UnixMilli() % 1_000_000)
	for _, j := range m.orphans {
		m.reattach(j)
	}
	m.orphans = nil
	if m.cfg.Hosts != nil {
		// Only the hosts of the latest remote jobs: a host is not
		// contacted at start otherwise.
		recent := map[string]bool{}
		if js, err := m.cfg.Store.Jobs(ctx, store.JobFilter{Kind: KindCommand, Limit: 100}); err == nil {
			for _, j := range js {
				if j.Host != "" {
					recent[j.Host] = true
				}
			}
		}
		if len(recent) > 0 {
			m.wg.Add(1)
			go func() {
				defer m.wg.Done()
				m.sweep(recent)
			}()
		}
	}
	m.started.Store(true)
	go m.loop()
	return nil
}

// Close kills every running local job's tree and waits for them. Their
// rows stay running: the next start reconciles them by their recovery
// policy. A job on a worker host is left running there under the host's
// systemd; the next start reattaches to its unit.
func (m *Manager) Close() {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return
	}
	m.closed = true
	for _, r := range m.running {
		r.cancel()
	}
	m.mu.Unlock()
	close(m.stop)
	m.wg.Wait()
	if m.started.Load() {
		<-m.done
	}
}

// Wakeups counts the scheduler's wake-ups since start.
func (m *Manager) Wakeups() int64 { return m.wakeups.Load() }

// NextWakeup is the deadline the timer is armed for (zero: none).
func (m *Manager) NextWakeup() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.armed
}

// Running lists the jobs running now, by id.
func (m *Manager) Running() []store.Job {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]store.Job, 0, len(m.running))
	for _, r := range m.running {
		out = append(out, r.job)
	}
	slices.SortFunc(out, func(a, b store.Job) int { return int(a.ID - b.ID) })
	return out
}

func (m *Manager) poke() {
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

// SetChildCancel installs how a running child agent's job is cancelled.
func (m *Manager) SetChildCancel(f func(ctx context.Context, j store.Job) (store.Job, error)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.cancelChild = f
}

// Ended wakes whoever waits for job id: a job ended outside the manager (a
// child agent, by package agents).
func (m *Manager) Ended(id int64) { m.ended(id) }

// ended wakes whoever waits for job id.
func (m *Manager) ended(id int64) {
	m.mu.Lock()
	ws := m.waiters[id]
	delete(m.waiters, id)
	m.mu.Unlock()
	for _, w := range ws {
		close(w)
	}
}

// Wait returns job id once it is final, or once a run ends after since runs
// (a recurring job), or when timeout passes (the job as it is then).
func (m *Manager) Wait(ctx context.Context, id int64, since int64, timeout time.Duration) (store.Job, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		ch := make(chan struct{})
		m.mu.Lock()
		m.waiters[id] = append(m.waiters[id], ch)
		m.mu.Unlock()
		j, err := m.cfg.Store.Job(ctx, id)
		if err != nil {
			return j, err
		}
		_, live := m.live(id)
		// A recurring job's run ended when it is pending again; a one-shot
		// that is pending again did not run (its host was not ready, or a
		// restart put it back): it is not done.
		recurring := len(j.Schedule) > 0 && string(j.Schedule) != "null"
		if j.State.Final() || (j.State == store.JobPending && recurring && j.Runs > since && !live) {
			return j, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			m.mu.Lock()
			ws := m.waiters[id]
			if i := slices.Index(ws, ch); i >= 0 {
				m.waiters[id] = slices.Delete(ws, i, i+1)
			}
			if len(m.waiters[id]) == 0 {
				delete(m.waiters, id)
			}
			m.mu.Unlock()
			return m.cfg.Store.Job(context.WithoutCancel(ctx), id)
		}
	}
}

func (m *Manager) live(id int64) (*run, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.running[id]
	return r, ok
}

// Cancel cancels job id: a running job's whole tree is killed and it ends
// cancelled; a pending one is cancelled at once.
func (m *Manager) Cancel(ctx context.Context, id int64) (store.Job, error) {
	if r, ok := m.live(id); ok {
		r.cancelled.Store(true)
		r.cancel()
		return m.Wait(ctx, id, r.job.Runs, 30*time.Second)
	}
	j, err := m.cfg.Store.Job(ctx, id)
	if err != nil {
		return j, err
	}
	if j.Kind == KindChild && j.State == store.JobRunning {
		m.mu.Lock()
		f := m.cancelChild
		m.mu.Unlock()
		if f != nil {
			return f(ctx, j)
		}
	}
	if j.State == store.JobPending {
		err := m.cfg.Store.Write(ctx, func(tx *store.Tx) error { return tx.CancelPendingJob(id, "") })
		if errors.Is(err, store.ErrJobState) {
			if _, ok := m.live(id); ok {
				return m.Cancel(ctx, id) // it started meanwhile: cancel the run
			}
		}
		if err != nil {
			return j, err
		}
		m.ended(id)
		m.poke()
		return m.cfg.Store.Job(ctx, id)
	}
	return j, fmt.Errorf("%w: job %d is %s", store.ErrJobState, id, j.State)
}

// recover reconciles jobs left running by a previous process. A command
// dispatched to a worker host is not decided here: its unit may still run
// there, and Start reattaches to it (reattach.go).
func (m *Manager) recover(ctx context.Context) error {
	jobs, err := m.cfg.Store.RunningJobs(ctx)
	if err != nil {
		return err
	}
	for _, j := range jobs {
		if j.Kind == KindChild {
			// A child is its session, which the turn loop resumes like any
			// other: its job stays running until the child ends.
			continue
		}
		if j.Kind == KindCommand && j.Host != "" && m.cfg.Hosts != nil {
			m.orphans = append(m.orphans, j)
			continue
		}
		if j.Kind == KindCommand && j.Host == "" && remoteSpec(j) {
			// Its attempt was never placed: nothing was sent to a host.
			if err := m.cfg.Store.Write(ctx, func(tx *store.Tx) error {
				return tx.RecoverJob(j.ID, store.JobPending, "klbr-core stopped before the job was sent to a host; it is sent again", "")
			}); err != nil {
				return fmt.Errorf("recover job %d: %w", j.ID, err)
			}
			continue
		}
		if err := m.reconcile(ctx, j, "klbr-core stopped while the command ran", "klbr-core stopped while it ran"); err != nil {
			return err
		}
	}
	return nil
}

// remoteSpec reports whether command job j runs on a worker host.
func remoteSpec(j store.Job) bool {
	var s CommandSpec
	return json.Unmarshal(j.Spec, &s) == nil && s.Host != ""
}

// reconcile moves a job whose run was lost (why; whyShort in the notice)
// to where its recovery policy puts it: a command is never rerun unless it
// is retry_safe.
func (m *Manager) reconcile(ctx context.Context, j store.Job, why, whyShort string) error {
	to, reason, notice := store.JobPending, "", ""
	switch {
	case j.Kind == KindCommand && j.Recovery != RetrySafe:
		to, reason = store.JobUnknown, why+"; its outcome is unknown and it was not run again"
		notice = fmt.Sprintf("[klbr] job %d (%s) is unknown: %s. It was not run again; check its effects and run it again yourself if needed.", j.ID, describe(j), whyShort)
	case j.Kind == KindCommand:
		reason = why + "; it is retry_safe and runs again"
		notice = fmt.Sprintf("[klbr] job %d (%s) was interrupted (%s); it is retry_safe and runs again.", j.ID, describe(j), whyShort)
	case j.Recovery == Manual:
		to, reason = store.JobUnknown, "klbr-core stopped while the routine ran; its recovery is manual"
		notice = fmt.Sprintf("[klbr] job %d (%s) is unknown: klbr-core stopped while it ran, and its recovery is manual. It was not run again.", j.ID, describe(j))
	case j.Recovery == Resume:
		reason = "resumed from its last checkpoint after a restart"
	default:
		reason = "run again after a restart (retry_safe)"
	}
	if err := m.cfg.Store.Write(ctx, func(tx *store.Tx) error {
		if err := tx.RecoverJob(j.ID, to, reason, notice); err != nil {
			return err
		}
		if to == store.JobPending && notice != "" {
			_, err := tx.AdmitInput(store.NewInput{Session: j.Session, SourceKind: "job",
				SourceKey: fmt.Sprintf("job:%d:%d:recovered", j.ID, j.Runs), Conversation: fmt.Sprintf("job:%d", j.ID),
				Author: "klbr", Directed: true, OccurredAt: tx.Now(), ReceivedAt: tx.Now(), Body: notice})
			return err
		}
		return nil
	}); err != nil {
		return fmt.Errorf("recover job %d: %w", j.ID, err)
	}
	m.cfg.Log.Warn("job was running when its run was lost", "job", j.ID, "kind", j.Kind, "recovery", j.Recovery, "why", why, "now", to)
	return nil
}

// place is where session's jobs work and the sandbox they run under.
// hostOf is the worker host session works on ("": here).
func (m *Manager) hostOf(ctx context.Context, session string) (string, error) {
	if m.cfg.Workspaces == nil {
		return "", nil
	}
	p, err := m.cfg.Workspaces.For(ctx, session)
	return p.Host, err
}

func (m *Manager) place(ctx context.Context, session string) (dir string, sb kernel.Sandbox, err error) {
	if m.cfg.Workspaces == nil {
		return m.cfg.Workspace, m.cfg.Sandbox, nil
	}
	p, err := m.cfg.Workspaces.For(ctx, session)
	if err != nil {
		return "", kernel.Sandbox{}, err
	}
	return p.Dir, m.cfg.Workspaces.SandboxFor(p), nil
}
