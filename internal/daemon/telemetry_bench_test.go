package daemon

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
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
// in one run. Each iteration runs one attempt of each, in alternating order
// (off first on even iterations, on first on odd ones), after a warm-up
// pair that is not counted: neither side gets the warmer process or the
// emptier store. It reports the sums' ratio and the median of the
// iterations' ratios, which one noisy attempt on a shared machine does not
// move. Run it with -benchtime=10x or more: b.N=1 is one pair.
func BenchmarkTurnLoopTracing(b *testing.B) {
	const steps = 200
	a := newBenchAgent(b)
	ctx := b.Context()
	sink := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusOK)
	}))
	defer sink.Close()
	tr, err := telemetry.New(ctx, telemetry.Options{Endpoint: sink.URL})
	if err != nil {
		b.Fatal(err)
	}
	defer tr.Close(context.Background())
	n := 0
	run := func(tracer tracing.Tracer) time.Duration {
		n++
		id := fmt.Sprintf("s-%d", n)
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
	run(nil) // warm-up: the kernel's imports, the store's pages, the exporter's connection
	run(tr)
	b.ResetTimer()
	var off, on time.Duration
	ratios := make([]float64, 0, b.N)
	for i := 0; i < b.N; i++ {
		var o, t time.Duration
		if i%2 == 0 {
			o = run(nil)
			t = run(tr)
		} else {
			t = run(tr)
			o = run(nil)
		}
		off, on = off+o, on+t
		ratios = append(ratios, float64(t)/float64(o))
	}
	slices.Sort(ratios)
	ms := func(d time.Duration) float64 { return float64(d) / float64(b.N) / float64(time.Millisecond) }
	b.ReportMetric(ms(off), "off_host_ms/step")
	b.ReportMetric(ms(on), "on_host_ms/step")
	b.ReportMetric(float64(on)/float64(off), "on/off")
	b.ReportMetric(ratios[len(ratios)/2], "median_on/off")
}
