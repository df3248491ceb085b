package daemon

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/admission"
	"github.com/klbr-dev/klbr/internal/config"
	"github.com/klbr-dev/klbr/internal/modeltest"
	"github.com/klbr-dev/klbr/internal/provider"
	"github.com/klbr-dev/klbr/internal/store"
	"github.com/klbr-dev/klbr/internal/turn"
)

// procKB reads a /proc/<pid> field in kB: "Pss" from smaps_rollup, or
// "VmRSS" from status.
func procKB(pid int, field string) float64 {
	file := "status"
	if field == "Pss" {
		file = "smaps_rollup"
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/%s", pid, file))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			n, _ := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 64)
			return n
		}
	}
	return 0
}

// kernelTree is a cell's Python process and, when it runs under a
// klbr-kernel process of its own, that one too.
func kernelTree(pid int) []int {
	out := []int{pid}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return out
	}
	if _, rest, ok := strings.Cut(string(b), ") "); ok {
		if f := strings.Fields(rest); len(f) > 1 {
			if ppid, _ := strconv.Atoi(f[1]); ppid > 1 && ppid != os.Getpid() {
				out = append(out, ppid)
			}
		}
	}
	return out
}

// startKernel runs a cell in session and returns its kernel's pid.
func (a *benchAgent) startKernel(b *testing.B, session string) int {
	b.Helper()
	res, err := a.bench.Execute(b.Context(), session, "import os\nos.getpid()", nil)
	if err != nil || res.Outcome == nil || res.Outcome.Value == nil {
		b.Fatalf("cell in %s: %+v, %v", session, res, err)
	}
	pid, err := strconv.Atoi(*res.Outcome.Value)
	if err != nil {
		b.Fatalf("pid %q", *res.Outcome.Value)
	}
	return pid
}

func hostBytes() (heap, rss float64) {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return float64(m.HeapInuse + m.StackInuse), procKB(os.Getpid(), "VmRSS") * 1024
}

// BenchmarkIdleChildMemory spawns 8 child agents (job, session, task
// input, as agents.spawn commits them), starts each one's turn loop and
// its Python kernel (one cell), and lets them idle; side by side, 8 plain
// root sessions the same way. It reports each one's kernel (PSS and RSS of
// its processes) and the host's growth per child (Go heap and the test
// process's RSS), and the child/root ratio of the host's growth.
func BenchmarkIdleChildMemory(b *testing.B) {
	const n = 8
	a := newBenchAgent(b)
	ctx := b.Context()
	if err := a.st.Write(ctx, func(tx *store.Tx) error { _, err := tx.EnsureSession("default"); return err }); err != nil {
		b.Fatal(err)
	}
	a.startKernel(b, "default")
	type sample struct{ pss, rss, heap, host float64 }
	measure := func(round int, child bool) sample {
		l := a.loop(&stepModel{}, 0)
		defer l.Close()
		heap0, rss0 := hostBytes()
		var pids []int
		var ids []string
		for i := range n {
			id := fmt.Sprintf("root-%d-%d", round, i)
			if child {
				if err := a.st.Write(ctx, func(tx *store.Tx) error {
					sp, err := tx.SpawnChild(store.NewChild{Parent: "default", Task: "idle"})
					id = sp.Session
					return err
				}); err != nil {
					b.Fatal(err)
				}
			} else if err := a.st.Write(ctx, func(tx *store.Tx) error { _, err := tx.EnsureSession(id); return err }); err != nil {
				b.Fatal(err)
			}
			pids = append(pids, a.startKernel(b, id))
			l.Start(id, false) // a child takes its task in, asks once and waits
			ids = append(ids, id)
		}
		for _, id := range ids {
			if child {
				a.waitState(b, id, store.StateWaiting)
			}
		}
		time.Sleep(500 * time.Millisecond)
		heap1, rss1 := hostBytes()
		var s sample
		for _, pid := range pids {
			for _, p := range kernelTree(pid) {
				s.pss += procKB(p, "Pss") * 1024
				s.rss += procKB(p, "VmRSS") * 1024
			}
		}
		s.pss, s.rss = s.pss/n, s.rss/n
		s.heap, s.host = (heap1-heap0)/n, (rss1-rss0)/n
		return s
	}
	var kid, root sample
	for i := range b.N {
		r := measure(2*i, false)
		k := measure(2*i+1, true)
		root.pss, root.rss, root.heap, root.host = root.pss+r.pss, root.rss+r.rss, root.heap+r.heap, root.host+r.host
		kid.pss, kid.rss, kid.heap, kid.host = kid.pss+k.pss, kid.rss+k.rss, kid.heap+k.heap, kid.host+k.host
	}
	N := float64(b.N)
	b.ReportMetric(kid.pss/N/(1<<20), "child_kernel_PSS_MB")
	b.ReportMetric(kid.rss/N/(1<<20), "child_kernel_RSS_MB")
	b.ReportMetric(kid.heap/N/(1<<10), "child_host_heap_KB")
	b.ReportMetric(kid.host/N/(1<<10), "child_host_RSS_KB")
	b.ReportMetric(root.pss/N/(1<<20), "root_kernel_PSS_MB")
	b.ReportMetric(root.heap/N/(1<<10), "root_host_heap_KB")
	b.ReportMetric(kid.pss/root.pss, "child/root_kernel")
}

// splitModel sends the children's requests to one route and the roots' to
// another: both real HTTP to scripted servers.
type splitModel struct{ root, child turn.Model }

func (m splitModel) Complete(ctx context.Context, req provider.Request) (*provider.Response, error) {
	if strings.HasPrefix(req.Meta.Session, "child-") {
		return m.child.Complete(ctx, req)
	}
	return m.root.Complete(ctx, req)
}

func scripted(b *testing.B, reply func() modeltest.Reply) turn.Model {
	b.Helper()
	srv := modeltest.New()
	b.Cleanup(srv.Close)
	srv.Otherwise(func(int) modeltest.Reply { return reply() })
	c, err := provider.New(config.Route{URL: srv.URL(), Model: "fake", TimeoutSeconds: 60}, provider.Options{})
	if err != nil {
		b.Fatal(err)
	}
	return c
}

func (a *benchAgent) slotLoop(m turn.Model, slots *turn.Slots) *turn.Loop {
	return turn.New(turn.Config{
		Store: a.st, Sessions: a.sessions, Bench: a.bench, Model: m, Route: "bench", Slots: slots,
		Prompt: func(context.Context, string) (string, error) { return "You are a benchmark.", nil },
		Budgets: turn.Budgets{MaxSteps: 1 << 20, MaxTokens: 1 << 40, MaxTurn: time.Hour, MaxEmpty: 3, MaxErrors: 3,
			ContextTokens: 1 << 30},
	})
}

// reply admits an operator input to the root and returns how long until
// its answer is committed: a new attempt, one model request answered with
// a cell that waits, the cell run and the wait committed.
func (a *benchAgent) reply(b *testing.B, key string) time.Duration {
	b.Helper()
	ctx := b.Context()
	var prev int64
	if t, err := a.st.Turn(ctx, "default"); err == nil && t.Attempt != nil {
		prev = t.Attempt.ID
	}
	start := time.Now()
	if _, err := a.admit.Admit(ctx, admission.DoorOperatorAPI, admission.Input{Session: "default", SourceKind: admission.SourceOperator,
		SourceKey: key, Conversation: "operator", Author: "operator", Body: "are you there?"}); err != nil {
		b.Fatal(err)
	}
	deadline := start.Add(time.Minute)
	for {
		t, err := a.st.Turn(ctx, "default")
		if err != nil {
			b.Fatal(err)
		}
		if t.Attempt != nil && t.Attempt.ID > prev && t.Attempt.State == store.AttemptWaiting {
			return time.Since(start)
		}
		if time.Now().After(deadline) {
			b.Fatalf("the root did not answer: %+v", t)
		}
		time.Sleep(200 * time.Microsecond)
	}
}

func median(ds []time.Duration) float64 {
	s := slices.Clone(ds)
	slices.Sort(s)
	return float64(s[len(s)/2]) / float64(time.Millisecond)
}

func mean(ds []time.Duration) float64 {
	var t time.Duration
	for _, d := range ds {
		t += d
	}
	return float64(t) / float64(len(ds)) / float64(time.Millisecond)
}

// BenchmarkRootReplyWithBusyChildren measures the root's reply to an
// operator input (admission to its committed answer: one model request
// and one cell) with no child running, then with ten children busy in
// model requests against a scripted server that answers each after 200
// ms with a cell (so they ask again at once), then with none again; all
// under [agents] model_slots = 4 (children hold at most 3). The root's
// route is a second scripted server that answers at once. It reports the
// root's median and mean reply with 0 and 10 busy children and their
// ratio (goal: within 20 %), and the children's requests in the run.
func BenchmarkRootReplyWithBusyChildren(b *testing.B) {
	const children, replies = 10, 40
	a := newBenchAgent(b)
	ctx := b.Context()
	var childRequests atomic.Int64
	m := splitModel{
		root: scripted(b, func() modeltest.Reply {
			return modeltest.Reply{Calls: []modeltest.Call{{Code: "await runtime.wait(None)"}}}
		}),
		child: scripted(b, func() modeltest.Reply {
			childRequests.Add(1)
			hold := make(chan struct{})
			time.AfterFunc(200*time.Millisecond, func() { close(hold) })
			return modeltest.Reply{Calls: []modeltest.Call{{Code: "x = 1"}}, Hold: hold}
		}),
	}
	if err := a.st.Write(ctx, func(tx *store.Tx) error { _, err := tx.EnsureSession("default"); return err }); err != nil {
		b.Fatal(err)
	}
	a.startKernel(b, "default")
	var kids []string
	for range children {
		if err := a.st.Write(ctx, func(tx *store.Tx) error {
			sp, err := tx.SpawnChild(store.NewChild{Parent: "default", Task: "keep asking"})
			kids = append(kids, sp.Session)
			return err
		}); err != nil {
			b.Fatal(err)
		}
		a.startKernel(b, kids[len(kids)-1])
	}
	type result struct {
		idle, busy []time.Duration
		inFlight   float64 // children in model requests at each busy reply's start, mean
		waits      int64
	}
	// [agents] model_slots = 4 (the default: children hold at most 3, the
	// other 7 wait for a slot) and 11 (all ten children in requests at once).
	sizes := []int{config.DefaultAgentsModelSlots, children + 1}
	res := map[int]*result{}
	n := 0
	warm := a.slotLoop(m, turn.NewSlots(4))
	warm.Start("default", false)
	for range 5 { // the first replies start the root's history and caches
		n++
		a.reply(b, fmt.Sprintf("warm-%d", n))
	}
	warm.Close()
	for range b.N {
		for _, size := range sizes {
			r := res[size]
			if r == nil {
				r = &result{}
				res[size] = r
			}
			slots := turn.NewSlots(size)
			root := a.slotLoop(m, slots)
			root.Start("default", false)
			for range replies / 2 {
				n++
				r.idle = append(r.idle, a.reply(b, fmt.Sprintf("idle-%d", n)))
			}
			childLoop := a.slotLoop(m, slots)
			for _, k := range kids {
				childLoop.Start(k, false)
			}
			deadline := time.Now().Add(time.Minute)
			for s := slots.Stats(); s.Children < size-1; s = slots.Stats() {
				if time.Now().After(deadline) {
					b.Fatalf("the children are not busy: %+v", s)
				}
				time.Sleep(time.Millisecond)
			}
			var inFlight int
			for range replies {
				n++
				inFlight += slots.Stats().Children
				r.busy = append(r.busy, a.reply(b, fmt.Sprintf("busy-%d", n)))
			}
			r.inFlight += float64(inFlight) / replies / float64(b.N)
			childLoop.Close()
			r.waits += slots.Stats().ChildrenWaited
			for range replies / 2 {
				n++
				r.idle = append(r.idle, a.reply(b, fmt.Sprintf("idle-%d", n)))
			}
			root.Close()
		}
	}
	if childRequests.Load() == 0 {
		b.Fatal("the children made no requests")
	}
	for _, size := range sizes {
		r := res[size]
		sfx := fmt.Sprintf("@slots%d", size)
		b.ReportMetric(median(r.idle), "root_p50_ms_0busy"+sfx)
		b.ReportMetric(median(r.busy), "root_p50_ms_10busy"+sfx)
		b.ReportMetric(mean(r.idle), "root_mean_ms_0busy"+sfx)
		b.ReportMetric(mean(r.busy), "root_mean_ms_10busy"+sfx)
		b.ReportMetric(median(r.busy)/median(r.idle), "p50_busy/idle"+sfx)
		b.ReportMetric(mean(r.busy)/mean(r.idle), "mean_busy/idle"+sfx)
		b.ReportMetric(r.inFlight, "children_in_requests"+sfx)
		b.ReportMetric(float64(r.waits)/float64(b.N), "child_slot_waits"+sfx)
	}
}
