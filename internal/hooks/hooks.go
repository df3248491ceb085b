// Package hooks runs a session's policy hooks (attention.plan,
// delivery.review and model.plan) in its hook worker, pinned to the session's active
// behavior release, under host deadlines. Every invocation is recorded.
// delivery.review fails closed: anything but a well-formed decision holds.
// attention.plan and model.plan fall back to the host's default.
package hooks

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/klbr-dev/klbr/internal/behavior"
	"github.com/klbr-dev/klbr/internal/jobs"
	"github.com/klbr-dev/klbr/internal/kernel"
	"github.com/klbr-dev/klbr/internal/placement"
	"github.com/klbr-dev/klbr/internal/provider"
	"github.com/klbr-dev/klbr/internal/store"
	"github.com/klbr-dev/klbr/internal/tracing"
	"github.com/klbr-dev/klbr/internal/worker"
	"github.com/klbr-dev/klbr/internal/workspace"
)

// Slots.
const (
	SlotPlan   = "attention.plan"
	SlotReview = "delivery.review"
)

// Config is what hook workers are made of.
type Config struct {
	Store      *store.Store
	Releases   *behavior.Releases
	Kernel     string
	Python     string
	RuntimeSrc string
	Workspace  string
	Placer     placement.Placer
	Limits     placement.Limits
	Sandbox    kernel.Sandbox // as workbench.Config.Sandbox
	Log        *slog.Logger
	// Deadlines per invocation; zero means 1 s for review, 500 ms for plan.
	ReviewDeadline time.Duration
	PlanDeadline   time.Duration
	// Observe, if set, is told of each invocation (for metrics).
	Observe func(slot, outcome string, latency time.Duration)
	// WorkerEvent, if set, is told of each hook worker lifecycle event
	// (started, reset, start_failed), for metrics.
	WorkerEvent func(event string)

	// Workspaces, when set, says where each session's hook worker works
	// (a child's worktree, a read-only workspace) and under which sandbox.
	Workspaces *workspace.Workspaces
}

// Dispatcher owns every session's hook worker.
type Dispatcher struct {
	cfg Config

	mu     sync.Mutex // guards pinned, retiring, gen, closed, noModelPlan, absent, bindings
	pinned map[string]*pinned
	// absent holds release+"\x00"+slot of optional slots a release's SLOTS
	// does not bind: the host's default applies without asking.
	absent   map[string]bool
	bindings map[string]Binding // by release
	stats    *Stats
	rec      *recorder
	// noModelPlan holds the releases whose SLOTS have no model.plan: the
	// host's default applies without asking (model.plan is optional).
	noModelPlan map[string]bool
	retiring    map[*worker.Worker]struct{} // replaced, finishing their invocations
	gen         int64
	closed      bool
	startMu     sync.Map // session → *sync.Mutex: one start at a time per session
	recorded    atomic.Int64
	slots       sync.Map // slot → struct{}: the slots invoked since start (whose inputs are pruned)
}

// seenSlots notes slot and returns every slot invoked since start.
func (d *Dispatcher) seenSlots(slot string) []string {
	d.slots.Store(slot, struct{}{})
	var out []string
	d.slots.Range(func(k, _ any) bool { out = append(out, k.(string)); return true })
	return out
}

// KeepInputs is how many of the newest invocations of each slot keep their
// input for replay; older inputs are pruned every pruneEvery records.
const (
	KeepInputs = 1000
	pruneEvery = 512
)

// pinned is a live hook worker and the release it runs.
type pinned struct {
	w       *worker.Worker
	release string
	epoch   int64
}

// New returns a Dispatcher.
func New(cfg Config) *Dispatcher {
	if cfg.ReviewDeadline <= 0 {
		cfg.ReviewDeadline = time.Second
	}
	if cfg.PlanDeadline <= 0 {
		cfg.PlanDeadline = 500 * time.Millisecond
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Observe == nil {
		cfg.Observe = func(string, string, time.Duration) {}
	}
	if cfg.WorkerEvent == nil {
		cfg.WorkerEvent = func(string) {}
	}
	d := &Dispatcher{cfg: cfg, pinned: map[string]*pinned{}, retiring: map[*worker.Worker]struct{}{}, noModelPlan: map[string]bool{},
		absent: map[string]bool{}, bindings: map[string]Binding{}, stats: newStats()}
	d.startRecorder()
	return d
}

// Config returns what the dispatcher was made with.
func (d *Dispatcher) Config() Config { return d.cfg }

// ErrUnavailable is the cause when no hook worker can run.
var ErrUnavailable = errors.New("hook worker unavailable")

// StartWorker starts a hook worker for release; it is how candidates are
// checked and how sessions get theirs.
func (d *Dispatcher) StartWorker(ctx context.Context, session, release string) (*worker.Worker, error) {
	if _, err := d.cfg.Releases.Verify(release); err != nil {
		return nil, err
	}
	d.mu.Lock()
	d.gen++
	gen := d.gen
	d.mu.Unlock()
	dir, sb := d.cfg.Workspace, d.cfg.Sandbox
	if ws := d.cfg.Workspaces; ws != nil {
		p, err := ws.For(ctx, session)
		if err != nil {
			return nil, err
		}
		dir, sb = p.Dir, ws.SandboxFor(p)
	}
	w, err := worker.Start(ctx, worker.Spec{
		Role: worker.RoleHooks, Session: session, Generation: gen,
		Kernel: d.cfg.Kernel, Python: d.cfg.Python, RuntimeSrc: d.cfg.RuntimeSrc, Workspace: dir,
		Behavior: d.cfg.Releases.Tree(release), Placer: d.cfg.Placer, Limits: d.cfg.Limits, Sandbox: sb,
		Handshake: 5 * time.Second, Log: d.cfg.Log,
		NoSite: true, // policy hooks use the standard library only
	})
	if err != nil {
		d.cfg.WorkerEvent("start_failed")
		return nil, err
	}
	d.cfg.WorkerEvent("started")
	return w, nil
}

// current returns the session's hook worker for its active release,
// starting one if needed.
func (d *Dispatcher) current(ctx context.Context, session string) (*pinned, error) {
	return d.currentKey(ctx, session, session)
}

// observerKey is where a session's observer worker is pinned: observers
// run in a worker of their own, so a slow observer never holds up (or has
// killed) the turn loop's hooks.
func observerKey(session string) string { return session + "\x00observers" }

// currentKey is current for the worker pinned at key (the session's, or
// its observers').
func (d *Dispatcher) currentKey(ctx context.Context, session, key string) (*pinned, error) {
	m, _ := d.startMu.LoadOrStore(key, &sync.Mutex{})
	mu := m.(*sync.Mutex)
	mu.Lock()
	defer mu.Unlock()
	sess, err := d.cfg.Store.Session(ctx, session)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	p := d.pinned[key]
	closed := d.closed
	d.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("%w: shutting down", ErrUnavailable)
	}
	if p != nil && p.epoch == sess.BehaviorEpoch {
		select {
		case <-p.w.Dead():
			d.cfg.WorkerEvent("reset") // it died; its Python state is lost
		default:
			return p, nil
		}
	}
	if sess.PolicyRevision == "" {
		return nil, fmt.Errorf("%w: session %s has no active behavior release", ErrUnavailable, session)
	}
	w, err := d.StartWorker(ctx, session, sess.PolicyRevision)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	np := &pinned{w: w, release: sess.PolicyRevision, epoch: sess.BehaviorEpoch}
	d.install(key, np)
	return np, nil
}

// install makes p the session's hook worker and stops the one it replaces.
func (d *Dispatcher) install(session string, p *pinned) {
	d.mu.Lock()
	old := d.pinned[session]
	d.pinned[session] = p
	d.mu.Unlock()
	if old != nil && old.w != p.w {
		d.retire(old.w)
	}
}

// retire stops a replaced worker once the invocations already on it can no
// longer be running: they finish on the behavior they started with.
func (d *Dispatcher) retire(w *worker.Worker) {
	d.mu.Lock()
	d.retiring[w] = struct{}{}
	d.mu.Unlock()
	time.AfterFunc(max(d.cfg.ReviewDeadline, d.cfg.PlanDeadline), func() {
		w.Stop()
		d.mu.Lock()
		delete(d.retiring, w)
		d.mu.Unlock()
	})
}

// Swap installs an already checked worker for a new epoch (hook-only
// activation): future invocations use it; the workbench is not touched.
func (d *Dispatcher) Swap(session string, w *worker.Worker, release string, epoch int64) {
	d.install(session, &pinned{w: w, release: release, epoch: epoch})
}

// call is one invocation on its way to its record.
type call struct {
	result json.RawMessage
	rec    store.HookInvocation
}

// Repin moves the session's running hook worker to a new epoch without
// replacing it (prompt-only activation: its hooks did not change).
func (d *Dispatcher) Repin(session, release string, epoch int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if p := d.pinned[session]; p != nil {
		d.pinned[session] = &pinned{w: p.w, release: release, epoch: epoch}
	}
}

// invoke calls slot under deadline. It never fails: the record says what
// happened, and the caller completes and stores it with finish.
func (d *Dispatcher) invoke(ctx context.Context, session, slot string, input any, deadline time.Duration) *call {
	return d.invokeAt(ctx, session, nil, slot, input, deadline)
}

// invokeAt is invoke for the behavior pinned at pin (nil: the active one).
// When the pin is not the session's live epoch (the cell started before an
// activation), a worker of the pinned release answers, then goes.
func (d *Dispatcher) invokeAt(ctx context.Context, session string, pin *store.Pin, slot string, input any, deadline time.Duration) *call {
	return d.invokeHandler(ctx, session, pin, slot, slot, input, deadline)
}

// invokeHandler is invokeAt calling handler (a key of the release's SLOTS:
// one of a transform's chain, an observer) for slot.
func (d *Dispatcher) invokeHandler(ctx context.Context, session string, pin *store.Pin, slot, handler string, input any, deadline time.Duration) *call {
	return d.invokeKey(ctx, session, session, pin, slot, handler, input, deadline)
}

// invokeKey is invokeHandler on the worker pinned at key.
func (d *Dispatcher) invokeKey(ctx context.Context, session, key string, pin *store.Pin, slot, handler string, input any, deadline time.Duration) *call {
	in, _ := json.Marshal(input)
	sum := sha256.Sum256(in)
	start := time.Now()
	ctx, span := tracing.Start(ctx, "klbr.hook "+slot, tracing.Options{})
	ctx, cancel := context.WithTimeout(ctx, deadline)
	defer cancel()
	c := &call{rec: store.HookInvocation{Session: session, Slot: slot, InputDigest: hex.EncodeToString(sum[:]), Outcome: "ok", Input: in}}
	p, err := d.currentKey(ctx, session, key)
	if err == nil && pin != nil && pin.Epoch != p.epoch && pin.Release != "" {
		var w *worker.Worker
		if w, err = d.StartWorker(ctx, session, pin.Release); err == nil {
			defer w.Kill()
			p = &pinned{w: w, release: pin.Release, epoch: pin.Epoch}
		} else {
			p = nil
		}
	}
	if err == nil {
		c.rec.Release, c.rec.Epoch = p.release, p.epoch
		c.result, err = p.w.Invoke(ctx, handler, in)
	}
	switch {
	case err == nil:
		c.rec.Result = c.result
	case p == nil, errors.Is(err, worker.ErrDead):
		c.rec.Outcome, c.rec.Error = "unavailable", err.Error()
	case errors.Is(err, worker.ErrTimeout):
		// A hung hook must not hang the next one: its worker is replaced.
		c.rec.Outcome, c.rec.Error = "timeout", fmt.Sprintf("no answer within %s", deadline)
		p.w.Kill()
	default:
		c.rec.Outcome, c.rec.Error = "error", err.Error()
	}
	c.rec.Latency = time.Since(start)
	endHookSpan(span, c, handler, tracing.Capture(ctx))
	return c
}

// finish records the invocation, outside the caller's deadline and off its
// path (see recorder).
func (d *Dispatcher) finish(c *call) {
	d.cfg.Observe(c.rec.Slot, c.rec.Outcome, c.rec.Latency)
	d.stats.add(c.rec.Slot, c.rec.Outcome, c.rec.Fallback, c.rec.Latency)
	d.record(c.rec)
}

// Close stops every hook worker and waits, bounded, until their trees are
// gone and their placements released.
func (d *Dispatcher) Close() {
	d.mu.Lock()
	d.closed = true
	ws := make([]*worker.Worker, 0, len(d.pinned)+len(d.retiring))
	for _, p := range d.pinned {
		ws = append(ws, p.w)
	}
	for w := range d.retiring {
		ws = append(ws, w)
	}
	d.pinned = map[string]*pinned{}
	d.mu.Unlock()
	for _, w := range ws {
		w.Stop()
	}
	worker.WaitDone(ws, 5*time.Second)
	d.closeRecorder()
}

// CheckResult validates a slot's answer to input as the host would.
func CheckResult(slot string, input any, out json.RawMessage) error {
	switch slot {
	case SlotReview:
		var r struct {
			Decision *string `json:"decision"`
			Reason   *string `json:"reason"`
		}
		if err := json.Unmarshal(out, &r); err != nil || r.Decision == nil || r.Reason == nil {
			return fmt.Errorf("answered %s, not {decision, reason}", truncate(out))
		}
		if *r.Decision != "allow" && *r.Decision != "hold" {
			return fmt.Errorf("decided %q, neither allow nor hold", *r.Decision)
		}
	case SlotModelPlan:
		in, ok := input.(provider.PlanInput)
		if !ok {
			return errors.New("model.plan check needs a provider.PlanInput")
		}
		var p provider.Plan
		if err := json.Unmarshal(out, &p); err != nil {
			return fmt.Errorf("answered %s, not {routes, reason}", truncate(out))
		}
		return validateModelPlan(in, p)
	case SlotPlan:
		in, ok := input.(PlanInput)
		if !ok {
			return errors.New("plan check needs a PlanInput")
		}
		var p Plan
		if err := json.Unmarshal(out, &p); err != nil {
			return fmt.Errorf("answered %s, not {order, defer, reason}", truncate(out))
		}
		return validatePlan(in, p)
	case SlotCompactionPlan:
		in, ok := input.(CompactionInput)
		if !ok {
			return errors.New("compaction.plan check needs a CompactionInput")
		}
		_, err := decodeCompactionPlan(in, out)
		return err
	case SlotJobPlan:
		var p jobs.Plan
		return decodeJobPlan(out, &p)
	case SlotSummaryPrepare:
		var r struct {
			Prompt *string `json:"prompt"`
		}
		if err := json.Unmarshal(out, &r); err != nil || r.Prompt == nil || *r.Prompt == "" {
			return fmt.Errorf("answered %s, not {prompt}", truncate(out))
		}
	case SlotTurnPrepare:
		in, _ := input.(PrepareTurnInput)
		_, err := decodeTurnPrep(in, out)
		return err
	case SlotTurnNext:
		_, err := decodeNext(out)
		return err
	case SlotExecutionReview:
		_, _, err := decodeVerdict(slot, out)
		return err
	default:
		return fmt.Errorf("unknown slot %q", slot)
	}
	return nil
}

func truncate(b []byte) string {
	if len(b) > 200 {
		return string(b[:200]) + "…"
	}
	return string(b)
}
