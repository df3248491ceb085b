// Package turn is the agent's loop: for each session it takes admitted
// input into frozen attention frames, asks the model, records the complete
// response before running anything, runs the python tool's cells in the
// workbench, records their outcomes before the next request, and waits
// without inference when the model yields. Every step is a committed
// boundary: a restart resumes from them and never replays a cell.
package turn

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/klbr-dev/klbr/internal/history"
	"github.com/klbr-dev/klbr/internal/hooks"
	"github.com/klbr-dev/klbr/internal/live"
	"github.com/klbr-dev/klbr/internal/provider"
	"github.com/klbr-dev/klbr/internal/session"
	"github.com/klbr-dev/klbr/internal/store"
	"github.com/klbr-dev/klbr/internal/tracing"
	"github.com/klbr-dev/klbr/internal/workbench"
	"github.com/klbr-dev/klbr/internal/worker"
)

// Model answers chat requests: provider.Client.
type Model interface {
	Complete(ctx context.Context, req provider.Request) (*provider.Response, error)
}

// Bench runs cells: workbench.Manager.
type Bench interface {
	Execute(ctx context.Context, session, code string, h worker.Handler) (workbench.Result, error)
}

// Planner orders pending input: hooks.Dispatcher's attention.plan, under
// the behavior pinned at pin (a running attempt's), or the active one (nil).
type Planner interface {
	PlanAt(ctx context.Context, session string, pin *store.Pin, in hooks.PlanInput) hooks.Plan
}

// CompactionPolicy is compaction.plan: hooks.Dispatcher.
type CompactionPolicy interface {
	PlanCompaction(ctx context.Context, session string, in hooks.CompactionInput) hooks.CompactionPlan
}

// Prompt returns the system prompt of a release: its soul and instructions.
type Prompt func(ctx context.Context, release string) (string, error)

// Budgets bound one attempt; see config.Agent.
type Budgets struct {
	MaxSteps      int
	MaxTokens     int
	MaxTurn       time.Duration
	MaxEmpty      int
	MaxErrors     int
	ContextTokens int
	// ReserveOutput is kept free of the budget for the answer; past
	// CompactAt (a fraction) of the budget, the context is compacted.
	ReserveOutput int
	CompactAt     float64
	ErrorBackoff  time.Duration // before retrying a failed request; doubles per error, with jitter
	MaxBackoff    time.Duration // the backoff's cap (agent.max_retry_backoff_ms)
}

// reminderTail ends the delivery reminder each addressed input gets, once,
// when the model ends its turn without answering it (reminderText names
// the inputs). A send to another conversation does not answer an input.
const reminderTail = "Your text is scratchpad; no one has read it. Send to each, or decide on purpose not to " +
	"and say why in your scratchpad, then wait."

// Config is what a Loop is made of.
type Config struct {
	Store    *store.Store
	Sessions *session.Manager
	Bench    Bench
	Planner  Planner // nil: hooks.DefaultPlan
	// Policy is turn.prepare, turn.next, execution.review and
	// context.prepare (nil: the host's defaults).
	Policy Policy
	Model  Model
	Route  string // the route's name, for records and metrics
	// URL and ModelName are the route's, for notices and status.
	URL, ModelName string
	Prompt         Prompt
	// Maintenance, if set, returns the maintenance skill body of a release:
	// it follows each maintenance goal in the context.
	Maintenance Prompt
	// Index, if set, returns the skill index offered with a release. The
	// system message carries the index of the transcript's start; a
	// change follows the history (the prompt cache keeps its prefix).
	Index  func(release string) string
	Deltas *live.Hub // nil: no deltas
	// Compactor compacts the context when it passes the threshold (nil:
	// never; a request over the budget pauses).
	Compactor *history.Compactor
	// Compaction chooses among eligible runs (compaction.plan); nil: the
	// oldest.
	Compaction CompactionPolicy
	// Estimator is the agent route's token estimate, shared with the
	// compactor (nil: a new one).
	Estimator *Estimator
	// QuietAmbient keeps ambient Discord input (neither DM nor mention)
	// from starting an attempt or ending a wait on its own ([discord]
	// ambient_wake = false): it is taken in with the next input that does.
	QuietAmbient bool
	Budgets      Budgets
	Clock        func() time.Time
	Log          *slog.Logger
	// Idle, if set, is told when an attempt of session ends idle (the model
	// ended its turn without waiting), with the text it ended with: a
	// child agent that did not call agents.finish ends so.
	Idle func(ctx context.Context, session, text string)
	// Observe is told of each model request's outcome and usage (metrics).
	Observe func(route, outcome string, usage provider.Usage)
	// Check, if set, is asked before each model request of a child
	// agent's session (one with a parent): an error keeps the request
	// from being sent and ends the attempt with it (the checker has ended
	// the child and stopped its session, saying why: a spent budget).
	Check func(ctx context.Context, session string) error
	// Reserve, if set, is asked after Check before each model request of a
	// child agent's session, with the request as it will be sent: it
	// reserves its largest cost against the budgets above the child
	// (waiting while they are reserved in full) and release is called
	// once the request's step is recorded. An error is Check's.
	Reserve func(ctx context.Context, session string, req provider.Request) (release func(), err error)
	// Slots, if set, bounds the model requests in flight ([agents]
	// model_slots): a child's request waits for a slot, a root's always
	// finds one that children cannot take.
	Slots *Slots
	// Tracer, if set, records a trace of each attempt ([telemetry]
	// otlp_endpoint): its model requests, cells, host requests and
	// compactions. nil: no tracing and no cost.
	Tracer tracing.Tracer
	// Images reads a fetched attachment's bytes by its artifact digest,
	// at most max of them (nil: no images are sent). Used only while
	// Live.Vision holds.
	Images func(sha256 string, max int64) ([]byte, error)
	// Vision seeds Live.Vision.
	Vision bool
}

// Loop runs the sessions' turn loops.
type Loop struct {
	cfg Config // Route, URL, ModelName, QuietAmbient and Budgets only seed live

	// live holds what a reload of klbr.toml may change (Reconfigure):
	// replaced whole, never changed in place; readers load it each time.
	inForce atomic.Pointer[Live]

	mu      sync.Mutex
	runners map[string]*runner
	closed  bool
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	ticks   atomic.Int64 // times a loop woke up to look at its session

	compactor *history.Compactor
	est       *Estimator // the agent route's token estimate

	ctxMu    sync.Mutex              // guards ctxState and earlier
	ctxState map[string]ContextState // by session
	earlier  map[string]float64      // compact_at lowered by compaction.plan, by session
}

// Live is the part of a Loop's Config that a reload of klbr.toml changes
// while sessions run: the agent's route (for records, notices and status)
// and the budgets. The next attempt, step or backoff uses the new values.
type Live struct {
	Route          string
	URL, ModelName string
	QuietAmbient   bool
	Budgets        Budgets
	// Vision: a route the agent's requests may go to takes images
	// ([routes.X] vision = true); the attempt's images are then attached.
	Vision bool
}

// live returns the Live values in force.
func (l *Loop) live() *Live { return l.inForce.Load() }

// Reconfigure puts lv in force (defaults filled in as New does).
func (l *Loop) Reconfigure(lv Live) {
	lv.Budgets = lv.Budgets.withDefaults()
	l.inForce.Store(&lv)
}

// Live returns the values in force (status, tests).
func (l *Loop) Live() Live { return *l.inForce.Load() }

// Ticks counts the times the session loops woke up to look at their
// session: an idle or waiting session adds none.
func (l *Loop) Ticks() int64 { return l.ticks.Load() }

// New returns a Loop; Start runs a session's loop.
func New(cfg Config) *Loop {
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Observe == nil {
		cfg.Observe = func(string, string, provider.Usage) {}
	}
	cfg.Budgets = cfg.Budgets.withDefaults()
	if cfg.Estimator == nil {
		cfg.Estimator = &Estimator{}
	}
	ctx, cancel := context.WithCancel(context.Background())
	l := &Loop{cfg: cfg, runners: map[string]*runner{}, ctx: ctx, cancel: cancel, compactor: cfg.Compactor,
		est: cfg.Estimator, ctxState: map[string]ContextState{}, earlier: map[string]float64{}}
	l.Reconfigure(Live{Route: cfg.Route, URL: cfg.URL, ModelName: cfg.ModelName, QuietAmbient: cfg.QuietAmbient, Budgets: cfg.Budgets,
		Vision: cfg.Vision})
	return l
}

// withDefaults fills the budgets' omitted values.
func (b Budgets) withDefaults() Budgets {
	if b.ErrorBackoff <= 0 {
		b.ErrorBackoff = 2 * time.Second
	}
	if b.MaxBackoff <= 0 {
		b.MaxBackoff = 5 * time.Minute
	}
	b.MaxBackoff = max(b.MaxBackoff, b.ErrorBackoff)
	if b.CompactAt <= 0 || b.CompactAt > 1 {
		b.CompactAt = 0.75
	}
	return b
}

// SetIdle installs Config.Idle; call it before Start.
func (l *Loop) SetIdle(f func(ctx context.Context, session, text string)) { l.cfg.Idle = f }

// Start runs session's loop until Close. resume is set for a session a
// previous run left in the middle of an attempt: it continues with a new
// attempt that says so.
func (l *Loop) Start(sessionID string, resume bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed || l.runners[sessionID] != nil {
		return
	}
	r := &runner{l: l, session: sessionID, resume: resume, deferred: map[int64]time.Time{}}
	l.runners[sessionID] = r
	l.wg.Go(func() { r.run(l.ctx) })
}

// Close stops every loop: a running attempt is interrupted at once (its
// model request cancelled, its cell interrupted and recorded), and Close
// returns when every loop has recorded where it stopped.
func (l *Loop) Close() {
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
	l.cancel()
	l.wg.Wait()
}

// errStopping ends attempts when the daemon stops.
var errStopping = errors.New("klbr-core is stopping")

// runner is one session's loop.
type runner struct {
	l       *Loop
	session string
	resume  bool

	// deferred holds the inputs attention.plan put off, until when.
	deferred map[int64]time.Time
	// retryAt, when set, is the earliest time of the next attempt: a
	// failed request's retry, or after a rejected or guarded attempt.
	retryAt time.Time
	// lastResume is when an attempt was last resumed without input.
	lastResume time.Time
	failures   int  // consecutive transient model failures, across attempts
	strikes    int  // consecutive attempts ended by a rejected request or a loop guard
	noResume   bool // the last attempt ended so: only input starts the next one
	// directedOnly: the route rejected the last request; only operator
	// input, a DM or a mention starts the next attempt.
	directedOnly bool
	cellErrors   int // consecutive cells that could not run, across attempts
	selfWakes    int // attempts in a row woken by a deadline, without input

	// turn.prepare: the start it deferred, how often in a row, and the
	// guidance the next attempt starts with.
	prepUntil  time.Time
	prepDefers int
	guidance   string

	// unfinished is an attempt whose end could not be recorded (a write
	// failed); the next tick ends it before anything else.
	unfinished    int64
	unfinishedWhy string

	statusMu sync.Mutex // guards status
	status   *Retry     // the backoff status shows; nil: none
	log      *slog.Logger
	// transcript is the current context epoch rendered so far.
	transcript *transcript
	// index is the skill index its system message carries (kept through
	// compactions; see assemble).
	index *epochIndex
}

func (r *runner) run(ctx context.Context) {
	r.log = r.l.cfg.Log.With("session", r.session)
	wake, cancel := r.l.cfg.Store.Watch(r.session)
	defer cancel()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		r.l.ticks.Add(1)
		gen := r.l.cfg.Store.ControlGen(r.session)
		next, err := r.tick(ctx)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			r.log.Error("turn loop", "error", err)
			if next.IsZero() {
				next = r.l.cfg.Clock().Add(time.Second)
			}
		}
		if now := r.l.cfg.Clock(); now.Before(r.retryAt) {
			next = earliest(next, r.retryAt) // the backoff the tick's attempt began ends in a retry
		}
		timer.Stop()
		if !next.IsZero() {
			timer.Reset(max(time.Until(next), 0))
		}
	sleep:
		select {
		case <-ctx.Done():
			return
		case <-wake:
			// While backing off, only a control change (an input, a state
			// move) is worth a look; the echo of the failed attempt's own
			// records is not: a retrying session wakes for its timer only.
			if r.l.cfg.Clock().Before(r.retryAt) && r.l.cfg.Store.ControlGen(r.session) == gen {
				goto sleep
			}
		case <-timer.C:
		}
	}
}

// tick looks at the session once and runs an attempt if something calls for
// one. It returns when the session has nothing to do, with the time at
// which to look again (zero: only when something changes).
func (r *runner) tick(ctx context.Context) (time.Time, error) {
	st := r.l.cfg.Store
	s, err := st.Session(ctx, r.session)
	if err != nil {
		return time.Time{}, err
	}
	if r.l.cfg.Sessions.Draining(r.session) {
		return time.Time{}, nil
	}
	now := r.l.cfg.Clock()
	switch s.State {
	case store.StateStopped, store.StatePaused:
		// They wait for the operator's start, which begins afresh.
		r.cellErrors, r.selfWakes = 0, 0
		r.clearBackoff()
		return time.Time{}, nil
	}
	if f := st.Fault(); f != nil {
		// Writes fail: no new work until they succeed again (the daemon
		// probes; a success wakes the session with its storage notice).
		return now.Add(time.Second), nil
	}
	if r.unfinished != 0 {
		// An attempt whose end could not be written: end it now.
		if err := r.finish(&attempt{id: r.unfinished}, store.AttemptInterrupted, "ended by a failed write: "+r.unfinishedWhy); err != nil &&
			!errors.Is(err, store.ErrNoAttempt) {
			return now.Add(time.Second), err
		}
		r.unfinished, r.unfinishedWhy = 0, ""
	}
	if now.Before(r.retryAt) {
		// Backing off: no attempt starts before retryAt, whatever arrives.
		return r.retryAt, nil
	}
	// Ready, waiting, or running (left so by a crash: only this runner
	// runs attempts). An armed wait counts in any of them: a session
	// stopped while waiting and started again still waits.
	w, err := st.ArmedWakeup(ctx, r.session)
	if err != nil {
		return time.Time{}, err
	}
	pending, err := st.PendingInputs(ctx, r.session)
	if err != nil {
		return time.Time{}, err
	}
	ready, next := r.plan(ctx, nil, pending, now)
	if len(ready) > 0 && r.wakes(ready) && (!r.directedOnly || directed(ready)) {
		wake := "input"
		if r.resume {
			wake = "input, after klbr-core restarted during an attempt"
		}
		if until := r.prepare(ctx, ready, wake, now); !until.IsZero() {
			return earliest(next, until), nil
		}
		return next, r.attempt(ctx, ready, wake, w != nil)
	}
	if w != nil {
		if w.Deadline == nil {
			return next, nil
		}
		if now.Before(*w.Deadline) {
			return earliest(next, *w.Deadline), nil
		}
		if r.selfWakes >= r.l.live().Budgets.MaxSteps {
			r.selfWakes = 0
			return next, r.endWaiting(ctx, fmt.Sprintf("%d wakes by deadline in a row without input (agent.max_steps): "+
				"the agent is polling itself; the next input starts a new attempt", r.l.live().Budgets.MaxSteps))
		}
		if until := r.prepare(ctx, nil, "deadline", now); !until.IsZero() {
			return earliest(next, until), nil
		}
		r.selfWakes++
		return next, r.attempt(ctx, nil, "deadline", true)
	}
	// No input and no wait: resume an attempt that ended without the model
	// finishing (a restart, a failed request, an operator stop or pause).
	turn, err := st.Turn(ctx, r.session)
	if err != nil || turn.Attempt == nil {
		return next, err
	}
	switch turn.Attempt.State {
	case store.AttemptInterrupted, store.AttemptFailed, store.AttemptPaused:
	default:
		return next, nil
	}
	if r.noResume {
		// The route rejected the last request, or a loop guard ended the
		// attempt: the next input starts a new one, not a resume.
		return next, nil
	}
	if again := r.lastResume.Add(r.l.live().Budgets.ErrorBackoff); now.Before(again) {
		return earliest(next, again), nil // an attempt that keeps ending at once is not retried in a tight loop
	}
	wake := fmt.Sprintf("resumed: the last attempt ended %s (%s)", turn.Attempt.State, turn.Attempt.Outcome)
	if r.resume {
		wake = "klbr-core restarted during an attempt; it was interrupted"
	}
	if until := r.prepare(ctx, nil, wake, now); !until.IsZero() {
		return earliest(next, until), nil
	}
	r.lastResume = now
	return next, r.attempt(ctx, nil, wake, false)
}

// plan runs attention.plan over the pending inputs and returns the ones to
// take in now, in its order, and when a deferred one falls due. pin is the
// running attempt's behavior (nil: the active one, for a new attempt).
func (r *runner) plan(ctx context.Context, pin *store.Pin, pending []store.PendingInput, now time.Time) ([]store.PendingInput, time.Time) {
	if len(pending) == 0 {
		clear(r.deferred)
		return nil, time.Time{}
	}
	byID := map[int64]store.PendingInput{}
	in := hooks.PlanInput{Now: unixSeconds(now)}
	for _, p := range pending {
		byID[p.ID] = p
		in.Items = append(in.Items, hooks.PlanItem{ID: p.ID, SourceKind: p.SourceKind, Directed: p.Directed,
			Conversation: p.Conversation, ReceivedAt: unixSeconds(p.ReceivedAt)})
	}
	var p hooks.Plan
	if r.l.cfg.Planner != nil {
		p = r.l.cfg.Planner.PlanAt(ctx, r.session, pin, in)
	} else {
		p = hooks.DefaultPlan(in)
	}
	clear(r.deferred)
	var next time.Time
	for _, d := range p.Defer {
		until := fromUnixSeconds(d.Until)
		r.deferred[d.ID] = until
		next = earliest(next, until)
	}
	var ready []store.PendingInput
	for _, id := range p.Order {
		if it, ok := byID[id]; ok {
			ready = append(ready, it)
		}
	}
	if len(ready) > MaxFrameInputs {
		// A burst is taken in frames of a bounded size, in the plan's
		// order; the rest stays pending for the next boundary.
		ready = ready[:MaxFrameInputs]
	}
	return ready, next
}

// MaxFrameInputs bounds the inputs one frame takes in.
const MaxFrameInputs = 64

// wakes reports whether inputs may start an attempt: any of them, unless
// ambient input is quiet; then only operator or directed input does.
func (r *runner) wakes(inputs []store.PendingInput) bool {
	if !r.l.live().QuietAmbient {
		return len(inputs) > 0
	}
	return directed(inputs)
}

// directed reports whether inputs hold operator input, a DM or a mention:
// after a rejected request only they start the next attempt (ambient
// chatter rides along with them).
func directed(inputs []store.PendingInput) bool {
	for _, in := range inputs {
		if in.SourceKind == "operator" || in.Directed {
			return true
		}
	}
	return false
}

// readyNow reports whether any of pending is not deferred and may wake the
// session (used inside the wait's transaction).
func (r *runner) readyNow(now time.Time) func([]store.PendingInput) bool {
	deferred := map[int64]time.Time{}
	for id, t := range r.deferred {
		deferred[id] = t
	}
	return func(pending []store.PendingInput) bool {
		var ready []store.PendingInput
		for _, p := range pending {
			if until, ok := deferred[p.ID]; !ok || !now.Before(until) {
				ready = append(ready, p)
			}
		}
		return r.wakes(ready)
	}
}

func earliest(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}

func unixSeconds(t time.Time) float64 { return float64(t.UnixMilli()) / 1000 }

func fromUnixSeconds(s float64) time.Time { return time.UnixMilli(int64(s * 1000)) }

// frameOf builds the frame of inputs.
func frameOf(s store.Session, inputs []store.PendingInput) store.Frame {
	ids := make([]int64, len(inputs))
	var convs []string
	seen := map[string]bool{}
	for i, in := range inputs {
		ids[i] = in.ID
		if in.Conversation != "" && !seen[in.Conversation] {
			seen[in.Conversation] = true
			convs = append(convs, in.Conversation)
		}
	}
	if convs == nil {
		convs = []string{}
	}
	routing := fmt.Appendf(nil, `{"inputs":%s,"conversations":%s}`, mustJSON(ids), mustJSON(convs))
	return store.Frame{Session: s.ID, InputIDs: ids, ContextEpoch: s.ContextEpoch, PolicyRevision: s.PolicyRevision, RoutingHandles: routing}
}

// endWaiting fires a waiting session's wakeup and returns it to ready
// instead of starting an attempt (a loop guard): a notice says why, and the
// next input starts a new attempt after a backoff.
func (r *runner) endWaiting(ctx context.Context, reason string) error {
	now := r.l.cfg.Clock()
	r.strikes++
	r.noResume = true
	r.retryAt = now.Add(r.l.live().Budgets.backoff(r.strikes))
	r.setStatus(&Retry{State: RetryBackingOff, NextAt: r.retryAt, InARow: r.strikes, LastError: reason, LastErrorAt: now,
		Fix: "the next input starts a new attempt"})
	return r.l.cfg.Store.Write(ctx, func(tx *store.Tx) error {
		s, err := tx.Session(r.session)
		if err != nil {
			return err
		}
		if _, err := tx.FireWakeup(r.session, "deadline"); err != nil {
			return err
		}
		if _, err := tx.Notice(r.session, "turn.ended", map[string]any{"reason": reason, "next_at": r.retryAt,
			"message": "the wait was ended by a loop guard; the next input starts a new attempt"}, true); err != nil {
			return err
		}
		if s.State != store.StateWaiting {
			return nil
		}
		return tx.TransitionSession(r.session, s.State, store.StateReady, reason)
	})
}
