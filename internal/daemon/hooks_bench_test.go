package daemon

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	behaviortree "github.com/klbr-dev/klbr/behavior"
	"github.com/klbr-dev/klbr/internal/activation"
	"github.com/klbr-dev/klbr/internal/admission"
	"github.com/klbr-dev/klbr/internal/behavior"
	"github.com/klbr-dev/klbr/internal/hooks"
	"github.com/klbr-dev/klbr/internal/store"
	"github.com/klbr-dev/klbr/internal/turn"
)

// unboundHooks binds only the two required slots: every other slot gets the
// host's default without a round trip.
const unboundHooks = `
from .attention import plan
from .delivery import review
SLOTS = {"attention.plan": plan, "delivery.review": review}
`

// BenchmarkTurnLoopHooks is BenchmarkTurnLoop's host cost per step (one
// python call each) with every slot of the step bound to the shipped
// defaults (context.prepare, turn.next, execution.review, result.present:
// four hook round trips and their records) and with them unbound (the host
// defaults, no round trip), side by side in one run.
func BenchmarkTurnLoopHooks(b *testing.B) {
	const steps = 300
	a := newBenchAgent(b)
	ctx := b.Context()
	dir := b.TempDir()
	rel, err := behavior.Open(filepath.Join(dir, "releases"))
	if err != nil {
		b.Fatal(err)
	}
	wb := a.bench.Config()
	hk := hooks.New(hooks.Config{Store: a.st, Releases: rel, Kernel: wb.Kernel, Python: wb.Python, RuntimeSrc: wb.RuntimeSrc,
		Workspace: wb.Workspace, Placer: wb.Placer, Limits: wb.Limits, Sandbox: wb.Sandbox})
	b.Cleanup(hk.Close)
	a.bench.SetPresent(presentResult(hk))
	svc := activation.New(a.st, rel, hk, nil, nil)
	bound, err := rel.Publish(behaviortree.Tree())
	if err != nil {
		b.Fatal(err)
	}
	tree := filepath.Join(dir, "unbound")
	copyDir(b, rel.Tree(bound.ID), tree)
	os.WriteFile(filepath.Join(tree, "klbr_hooks", "__init__.py"), []byte(unboundHooks), 0o644)
	os.WriteFile(filepath.Join(tree, "settings.toml"), []byte("[attention]\nambient_defer_seconds = 8\n"), 0o644)
	os.RemoveAll(filepath.Join(tree, "tests"))
	unbound, err := rel.Publish(os.DirFS(tree))
	if err != nil {
		b.Fatal(err)
	}
	run := func(name, release string, i int) float64 {
		id := fmt.Sprintf("%s-%d", name, i)
		if err := a.st.Write(ctx, func(tx *store.Tx) error { _, err := tx.EnsureSession(id); return err }); err != nil {
			b.Fatal(err)
		}
		if _, err := svc.Boot(ctx, id, release); err != nil {
			b.Fatal(err)
		}
		if _, err := a.bench.Execute(ctx, id, "n = 0", nil); err != nil {
			b.Fatal(err)
		}
		m := &stepModel{steps: steps}
		l := turn.New(turn.Config{
			Store: a.st, Sessions: a.sessions, Bench: a.bench, Model: m, Route: "bench", Planner: hk, Policy: hk,
			Prompt:  func(context.Context, string) (string, error) { return "You are a benchmark.", nil },
			Budgets: turn.Budgets{MaxSteps: steps + 10, MaxTokens: 1 << 40, MaxTurn: time.Hour, MaxEmpty: 3, MaxErrors: 3, ContextTokens: 1 << 30},
		})
		defer l.Close()
		l.Start(id, false)
		start := time.Now()
		if _, err := a.admit.Admit(ctx, admission.DoorOperatorAPI, admission.Input{Session: id, SourceKind: admission.SourceOperator,
			SourceKey: id, Conversation: "operator", Author: "operator", Body: "count"}); err != nil {
			b.Fatal(err)
		}
		a.waitState(b, id, store.StateWaiting)
		host := time.Since(start) - time.Duration(m.spent.Load())
		return float64(host) / float64(steps+1) / float64(time.Millisecond)
	}
	var withHooks, without float64
	for i := 0; i < b.N; i++ {
		// Alternated, so that the machine's drift weighs on both alike.
		without += run("unbound", unbound.ID, 2*i)
		withHooks += run("bound", bound.ID, 2*i)
		without += run("unbound", unbound.ID, 2*i+1)
		withHooks += run("bound", bound.ID, 2*i+1)
	}
	n := float64(2 * b.N)
	var calls int64
	for _, s := range hk.Stats() {
		switch s.Slot {
		case hooks.SlotContextPrepare, hooks.SlotTurnNext, hooks.SlotExecutionReview, hooks.SlotResultPresent:
			calls += s.Invocations
			if s.Fallbacks > 1 { // the unbound release is asked once (UnknownSlot)
				b.Errorf("%s fell back %d times", s.Slot, s.Fallbacks)
			}
		}
	}
	// The bound runs called all four slots at every step.
	if want := int64(4 * steps * 2 * b.N); calls < want {
		b.Fatalf("%d invocations of the step's slots, want at least %d", calls, want)
	}
	b.ReportMetric(float64(calls)/n/float64(steps+1), "hook_calls/step")
	b.ReportMetric(withHooks/n, "bound_ms/step")
	b.ReportMetric(without/n, "unbound_ms/step")
	b.ReportMetric((withHooks-without)/n, "hooks_ms/step")
}

func copyDir(b *testing.B, from, to string) {
	b.Helper()
	err := filepath.Walk(from, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(from, p)
		dst := filepath.Join(to, rel)
		if info.IsDir() {
			return os.MkdirAll(dst, 0o755)
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(dst, data, 0o644)
	})
	if err != nil {
		b.Fatal(err)
	}
}
