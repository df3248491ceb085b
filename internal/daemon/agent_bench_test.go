package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/admission"
	"github.com/klbr-dev/klbr/internal/api"
	"github.com/klbr-dev/klbr/internal/config"
	"github.com/klbr-dev/klbr/internal/localclient"
	"github.com/klbr-dev/klbr/internal/modeltest"
	"github.com/klbr-dev/klbr/internal/provider"
	"github.com/klbr-dev/klbr/internal/session"
	"github.com/klbr-dev/klbr/internal/setup"
	"github.com/klbr-dev/klbr/internal/store"
	"github.com/klbr-dev/klbr/internal/turn"
	"github.com/klbr-dev/klbr/internal/workbench"
)

// stepModel is a zero-latency model for the benchmark: it answers each
// request at once with one python call, and with a wait after steps calls.
// It counts the time spent in it, so that the loop's own time can be told
// apart from the model's.
type stepModel struct {
	steps int
	n     atomic.Int64
	spent atomic.Int64 // nanoseconds inside Complete
	cache promptCache
}

// promptCache emulates a provider's prefix cache over the requests as
// sent (tool schema, then the messages): a request's cached part is the
// longest prefix it shares with the previous one, in bytes.
type promptCache struct {
	prev           []byte
	prompt, cached int64
}

func (c *promptCache) observe(req provider.Request) {
	tools, _ := json.Marshal(req.Tools)
	msgs, _ := json.Marshal(req.Messages)
	p := append(tools, msgs...)
	n := 0
	for n < min(len(p), len(c.prev)) && p[n] == c.prev[n] {
		n++
	}
	c.prev, c.prompt, c.cached = p, c.prompt+int64(len(p)), c.cached+int64(n)
}

// share is the part of the prompts the cache served.
func (c *promptCache) share() float64 { return float64(c.cached) / float64(max(c.prompt, 1)) }

func (m *stepModel) Complete(ctx context.Context, req provider.Request) (*provider.Response, error) {
	start := time.Now()
	defer func() { m.spent.Add(int64(time.Since(start))) }()
	m.cache.observe(req) // the loop makes one request at a time
	n := int(m.n.Add(1))
	code := "n = n + 1 if 'n' in globals() else 1"
	if n > m.steps {
		code = "await runtime.wait(None, reason='done')"
	}
	call := provider.ToolCall{ID: fmt.Sprintf("call_%d", n), Type: "function",
		Function: provider.FunctionCall{Name: "python", Arguments: fmt.Sprintf(`{"code": %q}`, code)}}
	return &provider.Response{ToolCalls: []provider.ToolCall{call}, FinishReason: "tool_calls"}, nil
}

// benchAgent is an in-process store, workbench and turn loop.
type benchAgent struct {
	st       *store.Store
	sessions *session.Manager
	bench    *workbench.Manager
	admit    *admission.Admitter
}

func newBenchAgent(b testing.TB) *benchAgent {
	b.Helper()
	if os.Getenv(childEnv) != "" {
		b.Skip("in the child")
	}
	root := b.TempDir()
	dir := filepath.Join(root, "data")
	if _, err := setup.Init(b.Context(), dir); err != nil {
		b.Fatal(err)
	}
	b.Setenv("PATH", kernelDir(b)+":"+os.Getenv("PATH"))
	env := map[string]string{"KLBR_DATA_DIR": dir, "KLBR_WORKSPACE": root}
	cfg, err := config.Load(func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	if err != nil {
		b.Fatal(err)
	}
	st, err := store.Open(b.Context(), dir, store.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { st.Close() })
	sessions := session.NewManager(st)
	log := slog.New(slog.DiscardHandler)
	wb, _, err := newWorkbench(b.Context(), cfg, st, sessions, nil, log, nil, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(wb.Close)
	return &benchAgent{st: st, sessions: sessions, bench: wb, admit: admission.New(st, sessions, nil, nil)}
}

func (a *benchAgent) loop(m turn.Model, steps int) *turn.Loop {
	return turn.New(turn.Config{
		Store: a.st, Sessions: a.sessions, Bench: a.bench, Model: m, Route: "bench",
		Prompt: func(context.Context, string) (string, error) { return "You are a benchmark.", nil },
		Budgets: turn.Budgets{MaxSteps: steps + 10, MaxTokens: 1 << 40, MaxTurn: time.Hour, MaxEmpty: 3, MaxErrors: 3,
			ContextTokens: 1 << 30},
	})
}

func (a *benchAgent) waitState(b testing.TB, id string, want store.SessionState) {
	b.Helper()
	deadline := time.Now().Add(10 * time.Minute)
	for {
		s, err := a.st.Session(b.Context(), id)
		if err != nil {
			b.Fatal(err)
		}
		if s.State == want {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("session %s is %s, not %s", id, s.State, want)
		}
		time.Sleep(time.Millisecond)
	}
}

// BenchmarkTurnLoop runs 1,000 model steps of one python call each against
// a zero-latency model and reports the loop's host overhead per step (model
// time excluded; the cell's round trip included), steps per second, the bare
// cell round trip measured in the same run for comparison, the loop's
// wakeups while the session then waits, and the Go heap per idle session.
func BenchmarkTurnLoop(b *testing.B) {
	const steps = 1000
	a := newBenchAgent(b)
	ctx := b.Context()

	// The baseline: the same cell run directly, without the loop.
	if err := a.st.Write(ctx, func(tx *store.Tx) error { _, err := tx.EnsureSession("bare"); return err }); err != nil {
		b.Fatal(err)
	}
	if _, err := a.bench.Execute(ctx, "bare", "n = 0", nil); err != nil { // start its worker
		b.Fatal(err)
	}
	barePass := func() time.Duration {
		start := time.Now()
		for range steps / 2 {
			if _, err := a.bench.Execute(ctx, "bare", "n = n + 1 if 'n' in globals() else 1", nil); err != nil {
				b.Fatal(err)
			}
		}
		return time.Since(start)
	}
	// Half of the baseline before the loop's run and half after, so that
	// the machine's drift during the run weighs on both alike.
	bareTotal := barePass()
	var perStep, idleTicks float64
	for i := 0; i < b.N; i++ {
		id := fmt.Sprintf("bench-%d", i)
		if err := a.st.Write(ctx, func(tx *store.Tx) error { _, err := tx.EnsureSession(id); return err }); err != nil {
			b.Fatal(err)
		}
		if _, err := a.bench.Execute(ctx, id, "n = 0", nil); err != nil { // start its worker outside the timing
			b.Fatal(err)
		}
		m := &stepModel{steps: steps}
		l := a.loop(m, steps)
		l.Start(id, false)
		start := time.Now()
		if _, err := a.admit.Admit(ctx, admission.DoorOperatorAPI, admission.Input{Session: id, SourceKind: admission.SourceOperator,
			SourceKey: id, Conversation: "operator", Author: "operator", Body: "count to a thousand"}); err != nil {
			b.Fatal(err)
		}
		a.waitState(b, id, store.StateWaiting)
		total := time.Since(start)
		host := total - time.Duration(m.spent.Load())
		perStep = float64(host) / float64(steps+1) / float64(time.Millisecond)
		// Idle: the session waits for input; its loop must not wake up.
		time.Sleep(200 * time.Millisecond) // the wake of the wait's own commit
		before := l.Ticks()
		time.Sleep(time.Second)
		idleTicks = float64(l.Ticks() - before)
		l.Close()
	}
	bareTotal += barePass()
	bare := bareTotal / (steps / 2 * 2)
	b.ReportMetric(perStep, "host_ms/step")
	b.ReportMetric(1000/perStep, "steps/s")
	b.ReportMetric(float64(bare)/float64(time.Millisecond), "bare_cell_ms")
	b.ReportMetric(perStep/(float64(bare)/float64(time.Millisecond)), "step/bare_cell")
	b.ReportMetric(idleTicks, "idle_wakeups/s")
	b.ReportMetric(idleHeapPerSession(b, a), "idle_heap_B/session")
}

// idleHeapPerSession starts 1,000 idle session loops and reports the Go
// heap each costs (the Python workbench of a session that has run a cell is
// a separate process, not counted here).
func idleHeapPerSession(b *testing.B, a *benchAgent) float64 {
	const n = 1000
	ctx := b.Context()
	if err := a.st.Write(ctx, func(tx *store.Tx) error {
		for i := range n {
			if _, err := tx.EnsureSession(fmt.Sprintf("idle-%d", i)); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		b.Fatal(err)
	}
	l := a.loop(&stepModel{}, 0)
	defer l.Close()
	var m0, m1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m0)
	for i := range n {
		l.Start(fmt.Sprintf("idle-%d", i), false)
	}
	time.Sleep(500 * time.Millisecond) // each loop looks once, then sleeps
	runtime.GC()
	runtime.ReadMemStats(&m1)
	return float64(m1.HeapInuse+m1.StackInuse-m0.HeapInuse-m0.StackInuse) / n
}

// seedHistory gives session n context items, compacted as the loop would
// (all but the newest 50 under one summary after each batch), so the
// history is long and the active context short.
func seedHistory(b *testing.B, st *store.Store, session string, n int) {
	b.Helper()
	ctx := b.Context()
	const batch = 5000
	for done := 0; done < n; done += batch {
		if err := st.Write(ctx, func(tx *store.Tx) error {
			for i := done; i < min(done+batch, n); i++ {
				if _, err := tx.Notice(session, "bench.note", map[string]any{"text": fmt.Sprintf("earlier note %d", i)}, true); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			b.Fatal(err)
		}
		s, err := st.Session(ctx, session)
		if err != nil {
			b.Fatal(err)
		}
		ac, err := st.Active(ctx, session, s.ContextEpoch, 0)
		if err != nil {
			b.Fatal(err)
		}
		var refs []store.EntryRef
		for _, e := range ac.Entries[:len(ac.Entries)-50] {
			refs = append(refs, e.Ref())
		}
		if err := st.Write(ctx, func(tx *store.Tx) error {
			_, err := tx.CommitSummary(store.NewSummary{Session: session, Epoch: ac.Epoch, Version: ac.Version, Covers: refs,
				Kind: store.SummaryNormal, Text: fmt.Sprintf("notes through %d", done+batch), SourceTokens: 100000, SummaryTokens: 10})
			return err
		}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkTurnLoopHistory is BenchmarkTurnLoop's host cost per step with
// 1 k, 10 k, 100 k and 1 M items of history behind the session (compacted,
// as a long-lived session's is), side by side in one run: context assembly
// should track the active context, not the history. HISTORY_BENCH_MAX caps
// the sizes.
func BenchmarkTurnLoopHistory(b *testing.B) {
	const steps = 200
	sizes := []int{1_000, 10_000, 100_000, 1_000_000}
	if v := os.Getenv("HISTORY_BENCH_MAX"); v != "" {
		var limit int
		fmt.Sscan(v, &limit)
		sizes = slices.DeleteFunc(sizes, func(n int) bool { return n > limit })
	}
	a := newBenchAgent(b)
	ctx := b.Context()
	for _, n := range sizes {
		id := fmt.Sprintf("hist-%d", n)
		if err := a.st.Write(ctx, func(tx *store.Tx) error { _, err := tx.EnsureSession(id); return err }); err != nil {
			b.Fatal(err)
		}
		seedHistory(b, a.st, id, n)
		if _, err := a.bench.Execute(ctx, id, "n = 0", nil); err != nil {
			b.Fatal(err)
		}
	}
	per, cached := map[int]float64{}, map[int]float64{}
	for i := 0; i < b.N; i++ {
		for _, n := range sizes {
			id := fmt.Sprintf("hist-%d", n)
			m := &stepModel{steps: steps}
			l := a.loop(m, steps)
			l.Start(id, false)
			start := time.Now()
			if _, err := a.admit.Admit(ctx, admission.DoorOperatorAPI, admission.Input{Session: id, SourceKind: admission.SourceOperator,
				SourceKey: fmt.Sprintf("%s-%d", id, i), Conversation: "operator", Author: "operator", Body: "count"}); err != nil {
				b.Fatal(err)
			}
			a.waitState(b, id, store.StateWaiting)
			host := time.Since(start) - time.Duration(m.spent.Load())
			l.Close()
			per[n] += float64(host) / float64(steps+1) / float64(time.Millisecond) / float64(b.N)
			cached[n] += 100 * m.cache.share() / float64(b.N)
		}
	}
	for _, n := range sizes {
		b.ReportMetric(per[n], fmt.Sprintf("host_ms/step@%d", n))
	}
	for _, n := range sizes {
		b.ReportMetric(cached[n], fmt.Sprintf("cache_%%@%d", n))
	}
	b.ReportMetric(per[sizes[len(sizes)-1]]/per[sizes[0]], "largest/smallest")
}

// BenchmarkCoreRSSWithHistory starts a real klbr-core over a data directory
// with 10 k and 1 M items of (compacted) history, lets the agent take 20
// steps, and reports the daemon's resident memory, side by side: what the
// daemon holds must not grow with the history. HISTORY_BENCH_MAX caps the
// sizes.
func BenchmarkCoreRSSWithHistory(b *testing.B) {
	if os.Getenv(childEnv) != "" {
		b.Skip("in the child")
	}
	if _, err := exec.LookPath("python3"); err != nil {
		b.Skip("python3 is missing")
	}
	sizes := []int{10_000, 1_000_000}
	if v := os.Getenv("HISTORY_BENCH_MAX"); v != "" {
		var limit int
		fmt.Sscan(v, &limit)
		sizes = slices.DeleteFunc(sizes, func(n int) bool { return n > limit })
	}
	model := modeltest.New()
	defer model.Close()
	var steps atomic.Int64
	model.Otherwise(func(int) modeltest.Reply {
		if steps.Add(1)%21 == 0 {
			return modeltest.Reply{Calls: []modeltest.Call{{Code: "await runtime.wait(None)"}}}
		}
		return modeltest.Reply{Calls: []modeltest.Call{{Code: "print('step')"}}}
	})
	rss := map[int]float64{}
	for i := 0; i < b.N; i++ {
		for _, n := range sizes {
			data, env := instance(b)
			st, err := store.Open(b.Context(), data, store.Options{})
			if err != nil {
				b.Fatal(err)
			}
			if err := st.Write(b.Context(), func(tx *store.Tx) error { _, err := tx.EnsureSession("default"); return err }); err != nil {
				b.Fatal(err)
			}
			seedHistory(b, st, "default", n)
			st.Close()
			conf := filepath.Join(data, "klbr.toml")
			toml := fmt.Sprintf("[agent]\nroute = \"main\"\n[routes.main]\nurl = %q\nmodel = \"fake\"\n", model.URL())
			if err := os.WriteFile(conf, []byte(toml), 0o600); err != nil {
				b.Fatal(err)
			}
			env = append(env, "PATH="+kernelDir(b)+":"+os.Getenv("PATH"), "KLBR_CONFIG="+conf)
			d := startChildWithoutCgroups(b, nil, env...)
			c := localclient.New(filepath.Join(data, "control.sock"))
			wait := func(what string, cond func() bool) {
				deadline := time.Now().Add(5 * time.Minute)
				for !cond() {
					if time.Now().After(deadline) {
						b.Fatalf("%s:\n%s", what, d)
					}
					time.Sleep(20 * time.Millisecond)
				}
			}
			wait("the daemon answers", func() bool { _, err := c.Status(b.Context()); return err == nil })
			before := steps.Load()
			if _, err := c.Send(b.Context(), "default", api.SendRequest{Text: "take twenty steps", SourceKey: fmt.Sprintf("rss-%d-%d", n, i)}); err != nil {
				b.Fatal(err)
			}
			wait("the steps", func() bool {
				s, err := c.Session(b.Context(), "default")
				return err == nil && steps.Load() >= before+21 && s.State == store.StateWaiting
			})
			status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", d.cmd.Process.Pid))
			if err != nil {
				b.Fatal(err)
			}
			for _, line := range strings.Split(string(status), "\n") {
				if kb, ok := strings.CutPrefix(line, "VmRSS:"); ok {
					var v float64
					fmt.Sscan(strings.TrimSuffix(strings.TrimSpace(kb), " kB"), &v)
					rss[n] += v / 1024 / float64(b.N)
				}
			}
			c.Close()
			d.cmd.Process.Kill()
			<-d.exited
		}
	}
	for _, n := range sizes {
		b.ReportMetric(rss[n], fmt.Sprintf("rss_MiB@%d", n))
	}
	if len(sizes) > 1 {
		b.ReportMetric(rss[sizes[len(sizes)-1]]/rss[sizes[0]], "largest/smallest")
	}
}
