package activation

import (
	"context"
	"testing"
	"time"

	behaviortree "github.com/klbr-dev/klbr/behavior"
	"github.com/klbr-dev/klbr/internal/hooks"
	"github.com/klbr-dev/klbr/internal/store"
)

// BenchmarkStepHooks is what one turn-loop step of one cell asks of the
// hooks: context.prepare, turn.next, execution.review and result.present,
// with every one bound to the shipped defaults (four round trips to the
// hook worker, their records written off the step's path) and unbound (the
// host defaults, no round trip), side by side in one run.
func BenchmarkStepHooks(b *testing.B) {
	f := newFixture(b, time.Second)
	ctx := context.Background()
	m, err := f.rel.Publish(behaviortree.Tree())
	if err != nil {
		b.Fatal(err)
	}
	if _, err := f.svc.Boot(ctx, "s", m.ID); err != nil {
		b.Fatal(err)
	}
	f.st.Write(ctx, func(tx *store.Tx) error { _, err := tx.EnsureSession("u"); return err })
	if _, err := f.svc.Boot(ctx, "u", f.publish(b, allowHooks, "# soul\n")); err != nil {
		b.Fatal(err)
	}
	step := func(session string) {
		s, _ := f.st.Session(ctx, session)
		pin := &store.Pin{Epoch: s.BehaviorEpoch, Release: s.PolicyRevision}
		f.hk.PrepareContextAt(ctx, session, pin, hooks.ContextInput{Session: session, Attempt: 1, Step: 1, Additions: []string{}})
		f.hk.ReviewExecutionAt(ctx, session, pin, hooks.ExecutionInput{Session: session, Code: "n = n + 1", Call: "c", Step: 1, Attempt: 1})
		f.hk.PresentResultAt(ctx, session, pin, hooks.PresentInput{Session: session, Status: "ok", Text: "status: ok\nvalue: 2"})
		if n := f.hk.NextAt(ctx, session, pin, hooks.NextInput{Session: session, Attempt: 1, Steps: 1, Calls: 1}); n.Decision != "continue" {
			b.Fatalf("turn.next: %+v", n)
		}
	}
	step("u") // the unbound release is asked once, then never again
	for _, c := range []struct{ name, session string }{{"bound", "s"}, {"unbound", "u"}} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				step(c.session)
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/1000, "ms/step")
		})
	}
	f.hk.Flush()
}
