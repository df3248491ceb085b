package daemon

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/admission"
	"github.com/klbr-dev/klbr/internal/store"
	"github.com/klbr-dev/klbr/internal/telemetry"
	"github.com/klbr-dev/klbr/internal/tracing"
	"github.com/klbr-dev/klbr/internal/turn"
)

// BenchmarkTurnLoopTracing is BenchmarkTurnLoop's host time per step (one
// python call each, model time excluded) with tracing off and with an OTLP
// endpoint set (a local receiver that accepts every export), side by side
// in one run, alternating.
func BenchmarkTurnLoopTracing(b *testing.B) {
	const steps = 200
	a := newBenchAgent(b)
	ctx := b.Context()
	sink := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) }))
	defer sink.Close()
	tr, err := telemetry.New(ctx, telemetry.Options{Endpoint: sink.URL})
	if err != nil {
		b.Fatal(err)
	}
	defer tr.Close(context.Background())
	run := func(id string, tracer tracing.Tracer) time.Duration {
		if err := a.st.Write(ctx, func(tx *store.Tx) error { _, err := tx.EnsureSession(id); return err }); err != nil {
			b.Fatal(err)
		}
		if _, err := a.bench.Execute(ctx, id, "n = 0", nil); err != nil {
			b.Fatal(err)
		}
		m := &stepModel{steps: steps}
		l := turn.New(turn.Config{Store: a.st, Sessions: a.sessions, Bench: a.bench, Model: m, Route: "bench", ModelName: "bench",
			Prompt:  func(context.Context, string) (string, error) { return "You are a benchmark.", nil },
			Budgets: turn.Budgets{MaxSteps: steps + 10, MaxTokens: 1 << 40, MaxTurn: time.Hour, MaxEmpty: 3, MaxErrors: 3, ContextTokens: 1 << 30},
			Tracer:  tracer})
		defer l.Close()
		l.Start(id, false)
		start := time.Now()
		if _, err := a.admit.Admit(ctx, admission.DoorOperatorAPI, admission.Input{Session: id, SourceKind: admission.SourceOperator,
			SourceKey: id, Conversation: "operator", Author: "operator", Body: "count"}); err != nil {
			b.Fatal(err)
		}
		a.waitState(b, id, store.StateWaiting)
		return (time.Since(start) - time.Duration(m.spent.Load())) / (steps + 1)
	}
	var off, on time.Duration
	for i := 0; i < b.N; i++ {
		off += run(fmt.Sprintf("off-%d", i), nil)
		on += run(fmt.Sprintf("on-%d", i), tr)
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(b.N) / float64(time.Millisecond) }
	b.ReportMetric(ms(off), "off_host_ms/step")
	b.ReportMetric(ms(on), "on_host_ms/step")
	b.ReportMetric(float64(on)/float64(off), "on/off")
}
