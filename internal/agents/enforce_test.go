package agents

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/jobs"
	"github.com/klbr-dev/klbr/internal/store"
)

// recordSteps records n model steps of session with tokens each (prompt).
func recordSteps(t testing.TB, st *store.Store, session string, n, tokens int) {
	t.Helper()
	zero := 0
	if err := st.Write(context.Background(), func(tx *store.Tx) error {
		a, _, err := tx.StartAttempt(store.NewAttempt{Session: session, WakeReason: "test"})
		if err != nil {
			return err
		}
		for i := range n {
			if _, err := tx.RecordStep(store.StepResult{Session: session, Attempt: a, Ordinal: i + 1, Started: time.Now(), Route: "main",
				State: "completed", Text: "x", Usage: store.StepUsage{Prompt: &tokens, Completion: &zero}}); err != nil {
				return err
			}
		}
		return tx.FinishAttempt(a, store.AttemptIdle, "test")
	}); err != nil {
		t.Fatal(err)
	}
}

// kernels records the kernels StopKernel was asked to stop.
type kernels struct {
	mu      sync.Mutex
	stopped []string
}

func (k *kernels) stop(session, _ string) {
	k.mu.Lock()
	k.stopped = append(k.stopped, session)
	k.mu.Unlock()
}
func (k *kernels) list() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]string(nil), k.stopped...)
}

func newEnforced(t *testing.T, l store.ChildLimits, wall time.Duration, clock func() time.Time) (*Agents, *store.Store, *kernels) {
	t.Helper()
	st, err := store.Open(context.Background(), t.TempDir(), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if err := st.Write(context.Background(), func(tx *store.Tx) error { _, err := tx.EnsureSession("default"); return err }); err != nil {
		t.Fatal(err)
	}
	m := jobs.New(jobs.Config{Store: st})
	t.Cleanup(m.Close)
	k := &kernels{}
	return New(Config{Store: st, Jobs: m, Limits: l, MaxChildWall: wall, Clock: clock, StopKernel: k.stop}), st, k
}

func jobOf(t *testing.T, st *store.Store, id int64) store.Job {
	t.Helper()
	j, err := st.Job(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return j
}

// Before each request: under its budget a child goes on; at its tokens it
// is ended failed, saying which key, with a result saying so, its parent
// told once, its session and kernel stopped; its next request is refused
// as ended.
func TestCheckEndsAChildAtItsBudget(t *testing.T) {
	a, st, k := newEnforced(t, store.ChildLimits{}, 0, nil)
	ctx := context.Background()
	j, err := call(t, a, "default", "agents.spawn", `{"task":"t","budget":{"tokens":1000,"model_requests":5}}`)
	if err != nil {
		t.Fatal(err)
	}
	child := store.ChildSessionID(j.ID)
	// The child is told its budget in its task.
	recs, err := st.Records(ctx, child, 0, 100)
	if err != nil || len(recs) == 0 || !strings.Contains(string(recs[0].Content), "Your budget: at most 1000 model tokens, 5 model requests. Past it you are ended failed") {
		t.Fatalf("the child's task input %+v, %v", recs, err)
	}
	if err := a.Check(ctx, child); err != nil {
		t.Fatalf("a fresh child: %v", err)
	}
	if err := a.Check(ctx, "default"); err != nil {
		t.Fatalf("a root: %v", err)
	}
	recordSteps(t, st, child, 3, 300)
	if err := a.Check(ctx, child); err != nil {
		t.Fatalf("900 of 1000 tokens: %v", err)
	}
	recordSteps(t, st, child, 1, 134)
	err = a.Check(ctx, child)
	if !errors.Is(err, ErrExhausted) || !strings.Contains(err.Error(), "tokens 1034 of 1000 (budget.tokens)") {
		t.Fatalf("at the limit: %v", err)
	}
	got := jobOf(t, st, j.ID)
	if got.State != store.JobFailed || got.Error != "budget exhausted: tokens 1034 of 1000 (budget.tokens)" {
		t.Fatalf("job %+v", got)
	}
	var res map[string]any
	if json.Unmarshal(got.Result, &res) != nil || res["budget_exhausted"] != "budget.tokens" || res["used"] != 1034.0 {
		t.Fatalf("result %s", got.Result)
	}
	if s, _ := st.Session(ctx, child); s.State != store.StateStopped {
		t.Fatalf("the child's session is %s", s.State)
	}
	if ks := k.list(); len(ks) != 1 || ks[0] != child {
		t.Fatalf("kernels stopped: %v", ks)
	}
	p, _ := st.PendingInputs(ctx, "default")
	if len(p) != 1 {
		t.Fatalf("the parent has %d notifications, want 1", len(p))
	}
	if err := a.Check(ctx, child); !errors.Is(err, ErrEnded) {
		t.Fatalf("after the end: %v", err)
	}
	if p, _ := st.PendingInputs(ctx, "default"); len(p) != 1 {
		t.Fatalf("the parent was told again: %d", len(p))
	}
}

// model_requests counts requests; the tree's tokens count every
// descendant's, and stop both new spawns and new requests.
func TestCheckRequestsAndTreeTokens(t *testing.T) {
	a, st, _ := newEnforced(t, store.ChildLimits{MaxTreeTokens: 500}, 0, nil)
	ctx := context.Background()
	one, _ := call(t, a, "default", "agents.spawn", `{"task":"one","budget":{"model_requests":2}}`)
	two, _ := call(t, a, "default", "agents.spawn", `{"task":"two"}`)
	recordSteps(t, st, store.ChildSessionID(one.ID), 2, 10)
	if err := a.Check(ctx, store.ChildSessionID(one.ID)); err == nil || !strings.Contains(err.Error(), "model requests 2 of 2 (budget.model_requests)") {
		t.Fatalf("requests: %v", err)
	}
	if err := a.Check(ctx, store.ChildSessionID(two.ID)); err != nil {
		t.Fatalf("20 tree tokens: %v", err)
	}
	recordSteps(t, st, store.ChildSessionID(two.ID), 1, 480)
	if _, err := call(t, a, "default", "agents.spawn", `{"task":"three"}`); code(err) != "refused" || !strings.Contains(err.Error(), "agents.max_tree_tokens") {
		t.Fatalf("spawn past the tree's tokens: %v", err)
	}
	if err := a.Check(ctx, store.ChildSessionID(two.ID)); err == nil || !strings.Contains(err.Error(), "tree tokens 500 of 500 (agents.max_tree_tokens)") {
		t.Fatalf("tree: %v", err)
	}
	if j := jobOf(t, st, two.ID); j.State != store.JobFailed {
		t.Fatalf("two is %s", j.State)
	}
	if err := a.Check(ctx, "default"); err != nil {
		t.Fatalf("the root is not limited by its children: %v", err)
	}
}

// A child past its wall time is ended by the sweep while it idles: the
// tighter of budget.wall_seconds and agents.max_child_wall_seconds, from
// its job's start (so it holds across restarts).
func TestWallTimeSweep(t *testing.T) {
	now := time.Now()
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	a, st, k := newEnforced(t, store.ChildLimits{}, time.Hour, clock)
	short, _ := call(t, a, "default", "agents.spawn", `{"task":"short","budget":{"wall_seconds":60}}`)
	long, _ := call(t, a, "default", "agents.spawn", `{"task":"long","budget":{"wall_seconds":86400}}`)
	next := a.sweep()
	if !next.Equal(short.StartedAt.Add(time.Minute)) {
		t.Fatalf("next deadline %v, want the short child's (%v)", next, short.StartedAt.Add(time.Minute))
	}
	advance(61 * time.Second)
	next = a.sweep()
	if j := jobOf(t, st, short.ID); j.State != store.JobFailed || !strings.Contains(j.Error, "budget exhausted: wall time 6") || !strings.Contains(j.Error, "of 60s (budget.wall_seconds)") {
		t.Fatalf("short child %+v", j)
	}
	if !next.Equal(long.StartedAt.Add(time.Hour)) {
		t.Fatalf("next %v: the long child is capped by agents.max_child_wall_seconds", next)
	}
	advance(time.Hour)
	if a.sweep(); jobOf(t, st, long.ID).State != store.JobFailed || !strings.Contains(jobOf(t, st, long.ID).Error, "(agents.max_child_wall_seconds)") {
		t.Fatalf("long child %+v", jobOf(t, st, long.ID))
	}
	if len(k.list()) != 2 {
		t.Fatalf("kernels stopped %v", k.list())
	}
	// Run sweeps at once and ends with Close.
	go a.Run()
	a.Close()
	select {
	case <-a.done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not end")
	}
}

// Cancelling a child cancels its running descendants, each ended
// cancelled with its parent told once and its session and kernel stopped;
// a child's finish cancels its running children (and stops its own
// kernel); the operator's stop of a root cancels its children.
func TestCancelCascades(t *testing.T) {
	a, st, k := newEnforced(t, store.ChildLimits{}, 0, nil)
	ctx := context.Background()
	c1, _ := call(t, a, "default", "agents.spawn", `{"task":"c1"}`)
	s1 := store.ChildSessionID(c1.ID)
	g1, _ := call(t, a, s1, "agents.spawn", `{"task":"g1"}`)
	g2, _ := call(t, a, s1, "agents.spawn", `{"task":"g2"}`)
	gg, _ := call(t, a, store.ChildSessionID(g1.ID), "agents.spawn", `{"task":"gg"}`)
	if _, err := call(t, a, store.ChildSessionID(g2.ID), "agents.finish", `{"result":"early"}`); err != nil {
		t.Fatal(err)
	}
	if _, err := call(t, a, "default", "agents.cancel", `{"id":1}`); err != nil {
		t.Fatal(err)
	}
	for _, id := range []int64{c1.ID, g1.ID, gg.ID} {
		j := jobOf(t, st, id)
		if j.State != store.JobCancelled {
			t.Fatalf("job %d is %s", id, j.State)
		}
		if s, _ := st.Session(ctx, store.ChildSessionID(id)); s.State != store.StateStopped {
			t.Fatalf("session of %d is %s", id, s.State)
		}
	}
	if j := jobOf(t, st, g2.ID); j.State != store.JobSucceeded {
		t.Fatalf("the finished grandchild became %s", j.State)
	}
	if ks := strings.Join(k.list(), " "); ks != "child-3 child-1 child-2 child-4" {
		t.Fatalf("kernels stopped: %s", ks)
	}
	// Each parent told once: the root of c1, c1 of g1 (and of g2's finish),
	// g1 of gg (a child's own task is an input of kind job too).
	for session, want := range map[string]int{"default": 1, s1: 1 + 2, store.ChildSessionID(g1.ID): 1 + 1} {
		var n int
		for _, in := range pendingAll(t, st, session) {
			if in.SourceKind == "job" {
				n++
			}
		}
		if n != want {
			t.Fatalf("%s has %d job notifications, want %d", session, n, want)
		}
	}
	// A finish cancels the finisher's running children.
	c2, _ := call(t, a, "default", "agents.spawn", `{"task":"c2"}`)
	g3, _ := call(t, a, store.ChildSessionID(c2.ID), "agents.spawn", `{"task":"g3"}`)
	if _, err := call(t, a, store.ChildSessionID(c2.ID), "agents.finish", `{"result":1}`); err != nil {
		t.Fatal(err)
	}
	if j := jobOf(t, st, g3.ID); j.State != store.JobCancelled || !strings.Contains(j.Error, "its parent child-5") {
		t.Fatalf("g3 %+v", j)
	}
	// The operator stops the root: its running children are cancelled.
	c3, _ := call(t, a, "default", "agents.spawn", `{"task":"c3"}`)
	a.Stopped(ctx, "default")
	if j := jobOf(t, st, c3.ID); j.State != store.JobCancelled {
		t.Fatalf("c3 is %s after its parent's stop", j.State)
	}
}

func pendingAll(t *testing.T, st *store.Store, session string) []store.PendingInput {
	t.Helper()
	p, err := st.PendingInputs(context.Background(), session)
	if err != nil {
		t.Fatal(err)
	}
	return p
}
