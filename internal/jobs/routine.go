package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/klbr-dev/klbr/internal/store"
	"github.com/klbr-dev/klbr/internal/worker"
)

// RoleRoutine is the worker role routines run in: a fresh worker per run.
const RoleRoutine = "routine"

// RoutineSpec is what a routine or source job calls.
type RoutineSpec struct {
	Entry string          `json:"entry"` // "module:function", importable from the release tree
	Input json.RawMessage `json:"input"`
	// Host, when set, is where each run's worker runs: a [hosts.NAME] or
	// "label:L"; unset, here.
	Host string `json:"host,omitempty"`
}

// ScheduleRequest is a routine (or source) to schedule.
type ScheduleRequest struct {
	Session  string
	Parent   int64
	Release  string // the behavior release it is pinned to
	Kind     string // routine (default) or source
	Entry    string
	Input    json.RawMessage // nil means {}
	Schedule Schedule
	TZ       string // IANA name; "" means UTC
	Recovery string // "" means retry_safe
	Host     string // where each run goes ("NAME" or "label:L"); "" here
}

var entryPattern = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$`)

// Schedule admits a routine: its first deadline is stored in UTC with the
// requested time zone, and the timer fires it.
func (m *Manager) Schedule(ctx context.Context, req ScheduleRequest) (store.Job, error) {
	if req.Kind == "" {
		req.Kind = KindRoutine
	}
	if req.Kind != KindRoutine && req.Kind != KindSource {
		return store.Job{}, fmt.Errorf("jobs.schedule: kind is routine or source, not %q", req.Kind)
	}
	if len(req.Entry) > MaxEntryLen || !entryPattern.MatchString(req.Entry) {
		return store.Job{}, fmt.Errorf("jobs.schedule: entry must be \"module:function\" (such as \"klbr_skills.digest:run\"), not %q", req.Entry)
	}
	if req.Release == "" || m.cfg.Tree == nil {
		return store.Job{}, errors.New("jobs.schedule: no behavior release to pin the routine to")
	}
	if req.Input == nil {
		req.Input = json.RawMessage("{}")
	}
	if len(req.Input) > MaxInputBytes || !json.Valid(req.Input) {
		return store.Job{}, fmt.Errorf("jobs.schedule: input must be JSON of at most %d bytes", MaxInputBytes)
	}
	if req.Recovery == "" {
		req.Recovery = RetrySafe
	}
	if req.Recovery != RetrySafe && req.Recovery != Resume && req.Recovery != Manual {
		return store.Job{}, fmt.Errorf("jobs.schedule: recovery is retry_safe, resume or manual, not %q", req.Recovery)
	}
	if req.TZ == "" {
		req.TZ = "UTC"
	}
	loc, err := loadTZ(req.TZ)
	if err != nil {
		return store.Job{}, fmt.Errorf("jobs.schedule: tz: %w", err)
	}
	if err := req.Schedule.Validate(); err != nil {
		return store.Job{}, fmt.Errorf("jobs.schedule: %w", err)
	}
	if req.Host != "" {
		if m.cfg.Hosts == nil {
			return store.Job{}, fmt.Errorf("jobs.schedule: host=%q, but klbr.toml defines no [hosts.NAME]", req.Host)
		}
		if err := m.cfg.Hosts.Check(req.Host); err != nil {
			return store.Job{}, fmt.Errorf("jobs.schedule: %w", err)
		}
	}
	first := req.Schedule.First(m.cfg.Clock(), loc)
	if first.IsZero() {
		return store.Job{}, errors.New("jobs.schedule: the schedule never fires")
	}
	dir, _, err := m.place(ctx, req.Session)
	if err != nil {
		return store.Job{}, fmt.Errorf("jobs.schedule: %w", err)
	}
	return m.submit(ctx, store.NewJob{Kind: req.Kind, Session: req.Session, Parent: req.Parent, Release: req.Release,
		Workspace: dir, Spec: mustJSON(RoutineSpec{Entry: req.Entry, Input: req.Input, Host: req.Host}), Recovery: req.Recovery,
		Schedule: mustJSON(req.Schedule), TZ: req.TZ, NextDue: first,
		Budget: mustJSON(map[string]any{"wall_seconds": m.cfg.MaxWall.Seconds(), "memory_max": m.cfg.Limits.MemoryMaxBytes, "tasks_max": m.cfg.Limits.TasksMax})})
}

func loadTZ(name string) (*time.Location, error) {
	if len(name) > 64 || strings.Contains(name, "..") {
		return nil, fmt.Errorf("%q is not a time zone", name)
	}
	return time.LoadLocation(name)
}

// bootstrap is the cell a routine worker runs: the pinned release's tree goes
// first on sys.path, the entry is imported from it and called with its input.
const bootstrap = `import sys as _sys, json as _json, importlib as _il, inspect as _inspect
_sys.dont_write_bytecode = True
_tree = %s
_sys.path.insert(0, _tree)
for _name in [n for n in _sys.modules if n.split(".")[0] in ("klbr_skills", "klbr_hooks")]:
    del _sys.modules[_name]
from klbr import jobs as _jobs
_jobs._set_current(_json.loads(%s))
_modname, _fname = %s.split(":")
_mod = _il.import_module(_modname)
_origin = getattr(_mod, "__file__", None) or ""
import os as _os
if not _os.path.realpath(_origin).startswith(_os.path.realpath(_tree) + _os.sep):
    raise ImportError(f"{_modname} was imported from {_origin!r}, not from the pinned release {_tree!r}")
_fn = getattr(_mod, _fname)
_r = _fn(_jobs.current()["input"])
if _inspect.isawaitable(_r):
    _r = await _r
await _jobs._finish(_r)
`

func pyStr(s string) string { return strconv.Quote(s) } // a Go-quoted ASCII-safe string is a valid Python literal for these inputs

func (m *Manager) runRoutine(ctx context.Context, r *run, due time.Time) *store.JobEnd {
	j := r.job
	var spec RoutineSpec
	if err := json.Unmarshal(j.Spec, &spec); err != nil {
		return &store.JobEnd{ID: j.ID, To: store.JobFailed, Error: "unreadable spec: " + err.Error()}
	}
	sched, _ := decodeSchedule(j.Schedule)
	loc, err := loadTZ(j.TZ)
	if err != nil {
		loc = time.UTC
	}
	tree := m.cfg.Tree(j.Release)
	cur := map[string]any{"id": j.ID, "kind": j.Kind, "entry": spec.Entry, "input": spec.Input, "run": j.Runs,
		"due": float64(due.UnixMilli()) / 1000, "checkpoint": j.Checkpoint, "cursor": j.Cursor}
	code := func(tree string) string {
		return fmt.Sprintf(bootstrap, pyStr(tree), pyStr(string(mustJSON(cur))), pyStr(spec.Entry))
	}
	started := time.Now()
	h := &routineOps{m: m, job: j}
	out, runErr := m.callRoutine(ctx, j, spec.Host, tree, code, h)
	if errors.Is(runErr, errDeferred) {
		return nil // back to pending, with the reason: nothing ran
	}
	took := time.Since(started).Round(time.Millisecond)
	if ctx.Err() == context.Canceled && !r.cancelled.Load() {
		return nil // klbr-core is stopping: the next start reconciles it by its policy
	}
	e := &store.JobEnd{ID: j.ID}
	switch {
	case r.cancelled.Load():
		e.To, e.Error = store.JobCancelled, "cancelled; its worker was killed"
	case ctx.Err() == context.DeadlineExceeded:
		e.To, e.Error = store.JobFailed, fmt.Sprintf("ran past the wall-time limit (%s) and was killed", m.cfg.MaxWall)
	case runErr != nil:
		e.To, e.Error = store.JobFailed, runErr.Error()
	case out.Status != "ok":
		e.To, e.Error = store.JobFailed, "the routine ended "+out.Status
		if out.Error != nil {
			e.Error = out.Error.Type + ": " + out.Error.Message
		}
	default:
		e.To = store.JobSucceeded
		res, ok := h.outcome()
		if !ok {
			e.To, e.Error = store.JobFailed, "the routine ended without a result"
		}
		e.Result = res
	}
	next := time.Time{}
	if sched.Recurring() && e.To != store.JobCancelled {
		next = sched.NextAfterRun(due, m.cfg.Clock(), loc)
		if !next.IsZero() {
			e.NextDue = next
			if e.To == store.JobSucceeded || e.To == store.JobFailed {
				e.To = store.JobPending
			}
		}
	}
	e.Notice = routineNotice(j, e, took, next)
	return e
}

func (m *Manager) callRoutine(ctx context.Context, j store.Job, host, tree string, code func(tree string) string, h *routineOps) (*worker.Outcome, error) {
	dir, sb, err := m.place(ctx, j.Session)
	if err != nil {
		return nil, err
	}
	spec := worker.Spec{
		Role: RoleRoutine, Session: j.Session, Generation: m.gen.Add(1),
		Kernel: m.cfg.Kernel, Python: m.cfg.Python, RuntimeSrc: m.cfg.RuntimeSrc, Workspace: dir,
		Behavior: tree, Placer: m.cfg.Placer, Limits: m.cfg.Limits, Sandbox: sb, Artifacts: m.cfg.Artifacts,
		Log: m.cfg.Log,
	}
	if host != "" {
		var release func()
		if tree, release, err = m.remoteRoutine(ctx, j, host, &spec, tree); err != nil {
			return nil, err
		}
		defer release()
	}
	w, err := worker.Start(ctx, spec)
	if err != nil {
		return nil, fmt.Errorf("start the routine worker: %w", err)
	}
	defer worker.WaitDone([]*worker.Worker{w}, 5*time.Second)
	defer w.Stop()
	out, err := w.Execute(ctx, fmt.Sprintf("j%d-%d", j.ID, j.Runs), code(tree), h)
	if err == nil && out.Reset {
		w.Kill()
	}
	return out, err
}

func routineNotice(j store.Job, e *store.JobEnd, took time.Duration, next time.Time) string {
	if j.Kind == KindSource && e.Error == "" && e.To != store.JobCancelled {
		return "" // a source speaks through its events
	}
	if e.To == store.JobPending && e.Error == "" && (len(e.Result) == 0 || string(e.Result) == "null") {
		return "" // a recurring run that returned None has nothing to say
	}
	var b strings.Builder
	state := string(e.To)
	if e.To == store.JobPending {
		state = "succeeded"
		if e.Error != "" {
			state = "failed"
		}
	}
	fmt.Fprintf(&b, "[klbr] job %d %s (%s, run %d, %s)", j.ID, state, describe(j), j.Runs, took)
	if e.Error != "" {
		b.WriteString(": " + firstLine(e.Error, 300))
	} else if len(e.Result) > 0 {
		b.WriteString(": result " + firstLine(string(e.Result), 300))
	}
	b.WriteString(".")
	if !next.IsZero() {
		fmt.Fprintf(&b, " Next run at %s.", next.UTC().Format(time.RFC3339))
	}
	return b.String()
}

func firstLine(s string, max int) string {
	s, _, _ = strings.Cut(s, "\n")
	if len(s) > max {
		s = strings.ToValidUTF8(s[:max], "") + "…"
	}
	return s
}

// routineOps answers the requests of a running routine: its checkpoint and
// result, a source's events, and new jobs (children of this one).
type routineOps struct {
	m   *Manager
	job store.Job

	mu     sync.Mutex
	result json.RawMessage
	done   bool
}

func (h *routineOps) outcome() (json.RawMessage, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.result, h.done
}

func (h *routineOps) HandleRequest(ctx context.Context, r worker.Request) (json.RawMessage, error) {
	switch r.Op {
	case "jobs.finish":
		var a struct {
			Result json.RawMessage `json:"result"`
		}
		if err := decode(r, &a); err != nil {
			return nil, err
		}
		if len(a.Result) == 0 {
			a.Result = json.RawMessage("null")
		}
		h.mu.Lock()
		h.result, h.done = a.Result, true
		h.mu.Unlock()
		return json.RawMessage(`{"ok":true}`), nil
	case "jobs.checkpoint":
		var a struct {
			State json.RawMessage `json:"state"`
		}
		if err := decode(r, &a); err != nil {
			return nil, err
		}
		if len(a.State) == 0 {
			a.State = json.RawMessage("null")
		}
		if err := h.m.cfg.Store.Write(ctx, func(tx *store.Tx) error { return tx.CheckpointJob(h.job.ID, a.State) }); err != nil {
			return nil, &worker.RequestError{Code: "failed", Message: err.Error()}
		}
		return json.RawMessage(`{"ok":true}`), nil
	case "source.emit":
		return h.emit(ctx, r)
	default:
		if strings.HasPrefix(r.Op, "jobs.") {
			return h.m.handle(ctx, r, caller{session: h.job.Session, parent: h.job.ID, release: h.job.Release})
		}
		return nil, &worker.RequestError{Code: "unsupported", Message: r.Op + " is not served to routines"}
	}
}

// MaxPendingSourceEvents bounds a source's events waiting for the agent:
// beyond it, emit is refused (nothing of it is admitted, the cursor stays)
// until the agent has attended to them.
const MaxPendingSourceEvents = 1000

// EmitEvent is one event a source emits.
type EmitEvent struct {
	Key        string  `json:"key"`
	Text       string  `json:"text"`
	Author     string  `json:"author"`
	OccurredAt float64 `json:"occurred_at"` // unix seconds; 0 means now
}

func (h *routineOps) emit(ctx context.Context, r worker.Request) (json.RawMessage, error) {
	if h.job.Kind != KindSource {
		return nil, invalid("source.emit: job %d is a %s, not a source", h.job.ID, h.job.Kind)
	}
	var a struct {
		Events []EmitEvent      `json:"events"`
		Cursor *json.RawMessage `json:"cursor"`
	}
	if err := decode(r, &a); err != nil {
		return nil, err
	}
	if len(a.Events) > MaxEmitEvents {
		return nil, invalid("source.emit: at most %d events at once", MaxEmitEvents)
	}
	evs := make([]store.SourceEvent, 0, len(a.Events))
	now := h.m.cfg.Clock()
	for i, ev := range a.Events {
		if ev.Key == "" || len(ev.Key) > MaxEventKeyLen {
			return nil, invalid("source.emit: event %d needs a stable key of 1 to %d bytes", i, MaxEventKeyLen)
		}
		if len(ev.Text) > MaxEventBytes || len(ev.Author) > 200 {
			return nil, invalid("source.emit: event %d is larger than %d bytes", i, MaxEventBytes)
		}
		at := now
		if ev.OccurredAt > 0 {
			at = time.UnixMilli(int64(ev.OccurredAt * 1000))
		}
		author := ev.Author
		if author == "" {
			author = "source " + strconv.FormatInt(h.job.ID, 10)
		}
		evs = append(evs, store.SourceEvent{Key: ev.Key, Text: ev.Text, Author: author, OccurredAt: at})
	}
	var cursor json.RawMessage
	if a.Cursor != nil {
		cursor = *a.Cursor
		if len(cursor) > MaxInputBytes {
			return nil, invalid("source.emit: the cursor is larger than %d bytes", MaxInputBytes)
		}
	}
	var n int
	if err := h.m.cfg.Store.Write(ctx, func(tx *store.Tx) (err error) {
		n, err = tx.EmitSource(h.job.ID, evs, cursor, MaxPendingSourceEvents)
		return err
	}); errors.Is(err, store.ErrSourceBacklog) {
		return nil, &worker.RequestError{Code: "backlog", Message: err.Error()}
	} else if err != nil {
		return nil, &worker.RequestError{Code: "failed", Message: err.Error()}
	}
	return mustJSON(map[string]any{"admitted": n, "duplicates": len(evs) - n}), nil
}
