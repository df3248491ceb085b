package daemon

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/admission"
	"github.com/klbr-dev/klbr/internal/provider"
	"github.com/klbr-dev/klbr/internal/store"
	"github.com/klbr-dev/klbr/internal/turn"
)

// flakyModel is an in-process route that is down (a network error, as a
// refused connection gives) until up is set, then answers with a wait.
type flakyModel struct {
	up       atomic.Bool
	failures atomic.Int64
}

func (m *flakyModel) Complete(ctx context.Context, req provider.Request) (*provider.Response, error) {
	if !m.up.Load() {
		m.failures.Add(1)
		return nil, &provider.Error{Kind: provider.KindNetwork, Msg: "sending the request: connection refused"}
	}
	call := provider.ToolCall{ID: "call_1", Type: "function",
		Function: provider.FunctionCall{Name: "python", Arguments: `{"code": "await runtime.wait(None, reason='answered')"}`}}
	return &provider.Response{ToolCalls: []provider.ToolCall{call}, FinishReason: "tool_calls"}, nil
}

// BenchmarkRouteReturn measures how long after a route comes back the
// waiting input is answered (goal: within the backoff cap plus 1 s), side
// by side with the same input answered by a route that was up all along,
// and the loop's wakeups per second while it backs off at the cap (goal:
// only its timer, one wakeup per retry).
func BenchmarkRouteReturn(b *testing.B) {
	const (
		base   = 50 * time.Millisecond
		capped = time.Second
		down   = 4 * time.Second
	)
	a := newBenchAgent(b)
	ctx := b.Context()
	run := func(id string, m *flakyModel, whileDown func(l *turn.Loop)) time.Duration {
		if err := a.st.Write(ctx, func(tx *store.Tx) error { _, err := tx.EnsureSession(id); return err }); err != nil {
			b.Fatal(err)
		}
		if _, err := a.bench.Execute(ctx, id, "n = 0", nil); err != nil { // its worker, outside the timing
			b.Fatal(err)
		}
		l := turn.New(turn.Config{
			Store: a.st, Sessions: a.sessions, Bench: a.bench, Model: m, Route: "bench",
			Prompt: func(context.Context, string) (string, error) { return "You are a benchmark.", nil },
			Budgets: turn.Budgets{MaxSteps: 40, MaxTokens: 1 << 40, MaxTurn: time.Hour, MaxEmpty: 3, MaxErrors: 3,
				ContextTokens: 1 << 30, ErrorBackoff: base, MaxBackoff: capped},
		})
		defer l.Close()
		l.Start(id, false)
		start := time.Now()
		if _, err := a.admit.Admit(ctx, admission.DoorOperatorAPI, admission.Input{Session: id, SourceKind: admission.SourceOperator,
			SourceKey: id, Conversation: "operator", Author: "operator", Body: "are you there?"}); err != nil {
			b.Fatal(err)
		}
		if whileDown != nil {
			whileDown(l)
			m.up.Store(true)
			start = time.Now()
		}
		a.waitState(b, id, store.StateWaiting)
		return time.Since(start)
	}
	var after, baseline, wakeups, retries float64
	for i := 0; i < b.N; i++ {
		up := &flakyModel{}
		up.up.Store(true)
		baseline = float64(run(fmt.Sprintf("up-%d", i), up, nil)) / float64(time.Millisecond)
		flaky := &flakyModel{}
		after = float64(run(fmt.Sprintf("flaky-%d", i), flaky, func(l *turn.Loop) {
			time.Sleep(down)
			// At the cap now: count the loop's wakeups and the retries over 3 s.
			t0, f0 := l.Ticks(), flaky.failures.Load()
			time.Sleep(3 * time.Second)
			wakeups = float64(l.Ticks()-t0) / 3
			retries = float64(flaky.failures.Load()-f0) / 3
		})) / float64(time.Millisecond)
	}
	b.ReportMetric(after, "ms_after_return")
	b.ReportMetric(baseline, "baseline_ms")
	b.ReportMetric(after/baseline, "after_return/baseline")
	b.ReportMetric(float64(capped+time.Second)/float64(time.Millisecond), "goal_ms")
	b.ReportMetric(wakeups, "backoff_wakeups/s")
	b.ReportMetric(retries, "retries/s")
}
