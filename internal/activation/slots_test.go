package activation

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/hooks"
	"github.com/klbr-dev/klbr/internal/store"
)

// publishWith is publish with a settings.toml.
func (f *fixture) publishWith(t testing.TB, hooksPy, settings string) string {
	t.Helper()
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "klbr_hooks"), 0o755)
	os.WriteFile(filepath.Join(dir, "klbr_hooks", "__init__.py"), []byte(hooksPy), 0o644)
	os.WriteFile(filepath.Join(dir, "soul.md"), []byte(f.soul), 0o644)
	if settings != "" {
		os.WriteFile(filepath.Join(dir, "settings.toml"), []byte(settings), 0o644)
	}
	m, err := f.rel.Publish(os.DirFS(dir))
	if err != nil {
		t.Fatal(err)
	}
	return m.ID
}

// misbehave is a hook module whose every new slot misbehaves as its input
// asks: "raise", "garbage", "sleep", "die", else a good answer.
const misbehave = `
import os, time
def mode(inp):
    s = str(inp)
    for m in ("raise", "garbage", "sleep", "die", "weird"):
        if m in s:
            return m
    return ""
def act(inp, good, weird):
    m = mode(inp)
    if m == "raise":
        raise ValueError("hook bug")
    if m == "garbage":
        return {"nonsense": True}
    if m == "weird":
        return weird
    if m == "sleep":
        time.sleep(5)
    if m == "die":
        os._exit(1)
    return good
SLOTS = {
    "attention.plan": lambda i: {"order": [x["id"] for x in i["items"]], "defer": [], "reason": ""},
    "delivery.review": lambda i: {"decision": "allow", "reason": "ok"},
    "turn.prepare": lambda i: act(i, {"decision": "defer" if "later" in str(i) else "start", "seconds": 5, "guidance": "be brief", "reason": "r"},
                                  {"decision": "defer", "seconds": 9999, "reason": "too long"}),
    "turn.next": lambda i: act(i, {"decision": "end", "reason": "enough"}, {"decision": "wait", "seconds": -1, "reason": "?"}),
    "execution.review": lambda i: act(i, {"decision": "hold" if "rm -rf" in i["code"] else "allow", "reason": "policy"},
                                      {"decision": "maybe", "reason": "?"}),
    "context.prepare": lambda i: act(i, {"additions": i["additions"] + ["first"]}, {"additions": ["x" * 5000]}),
    "context.second": lambda i: act(i, {"additions": i["additions"] + ["second"]}, {"additions": 5}),
    "delivery.prepare": lambda i: act(i, {"parts": [p[k:k+i["limit"]] for p in i["parts"] for k in range(0, len(p), i["limit"])]},
                                      {"parts": ["x" * (i["limit"] + 1)]}),
    "result.present": lambda i: act(i, {"text": "presented: " + i["text"]}, {"text": 7}),
}
`

const misbehaveSettings = `
[hooks]
required = []
[hooks.transforms]
"context.prepare" = ["context.prepare", "context.second"]
"delivery.prepare" = ["delivery.prepare"]
"result.present" = ["result.present"]
`

var bad = []string{"raise", "garbage", "weird", "sleep", "die"}

// Every decision and transform slot: a failing, slow, malformed or dying
// hook gets the documented fallback, and the next invocation is served.
func TestEverySlotFallsBack(t *testing.T) {
	f := newFixture(t, time.Second)
	ctx := context.Background()
	if _, err := f.svc.Boot(ctx, "s", f.publishWith(t, misbehave, misbehaveSettings)); err != nil {
		t.Fatal(err)
	}
	pin := func() *store.Pin {
		s, _ := f.st.Session(ctx, "s")
		return &store.Pin{Epoch: s.BehaviorEpoch, Release: s.PolicyRevision}
	}
	h := f.hk
	for _, m := range bad {
		t.Run(m, func(t *testing.T) {
			if p := h.PrepareTurn(ctx, "s", hooks.PrepareTurnInput{Session: "s", Wake: m + " later"}); p.Defer != 0 || p.Guidance != "" || !p.Fallback {
				t.Errorf("turn.prepare %s: %+v, want start now", m, p)
			}
			if n := h.NextAt(ctx, m, pin(), hooks.NextInput{Session: m}); n.Decision != "continue" || !n.Fallback {
				t.Errorf("turn.next %s: %+v, want continue", m, n)
			}
			if d := h.ReviewExecutionAt(ctx, "s", pin(), hooks.ExecutionInput{Session: "s", Code: m}); !d.Allow || !d.Fallback {
				t.Errorf("execution.review %s: %+v, want allow (not required)", m, d)
			}
			adds := h.PrepareContextAt(ctx, "s", pin(), hooks.ContextInput{Session: m, Additions: []string{}})
			if len(adds) != 0 {
				t.Errorf("context.prepare %s: %q, want none (both handlers fail)", m, adds)
			}
			parts := h.PrepareDeliveryAt(ctx, "s", pin(), hooks.DeliveryInput{Session: m, Limit: 10, Parts: []string{"0123456789abcdef"}})
			if !slices.Equal(parts, []string{"0123456789abcdef"}) {
				t.Errorf("delivery.prepare %s: %q, want the text as it is", m, parts)
			}
			if got := h.PresentResultAt(ctx, "s", pin(), hooks.PresentInput{Session: m, Text: "status: ok"}); got != "status: ok" {
				t.Errorf("result.present %s: %q", m, got)
			}
			// Served again afterwards (a fresh worker where one died or hung).
			if p := h.PrepareTurn(ctx, "s", hooks.PrepareTurnInput{Session: "s", Wake: "input"}); p.Fallback || p.Guidance != "be brief" {
				t.Errorf("after %s: turn.prepare %+v", m, p)
			}
		})
	}
	// Good answers stand, each validated by the host.
	if p := h.PrepareTurn(ctx, "s", hooks.PrepareTurnInput{Session: "s", Wake: "later"}); p.Defer != 5*time.Second || p.Fallback {
		t.Errorf("defer: %+v", p)
	}
	// Operator input is never deferred.
	if p := h.PrepareTurn(ctx, "s", hooks.PrepareTurnInput{Session: "s", Wake: "later",
		Inputs: []hooks.TurnInputRef{{ID: 1, SourceKind: "operator"}}}); p.Defer != 0 || !p.Fallback || !strings.Contains(p.Reason, "operator") {
		t.Errorf("deferred operator: %+v", p)
	}
	if n := h.NextAt(ctx, "s", pin(), hooks.NextInput{Session: "s"}); n.Decision != "end" || n.Fallback {
		t.Errorf("turn.next: %+v", n)
	}
	if d := h.ReviewExecutionAt(ctx, "s", pin(), hooks.ExecutionInput{Session: "s", Code: "rm -rf /"}); d.Allow || d.Fallback || d.Reason != "policy" {
		t.Errorf("execution.review hold: %+v", d)
	}
	// Transforms run in the manifest's order, each on the previous output.
	if adds := h.PrepareContextAt(ctx, "s", pin(), hooks.ContextInput{Session: "s", Additions: []string{}}); !slices.Equal(adds, []string{"first", "second"}) {
		t.Errorf("context.prepare chain: %q", adds)
	}
	if parts := h.PrepareDeliveryAt(ctx, "s", pin(), hooks.DeliveryInput{Session: "s", Limit: 10, Parts: []string{"0123456789abcdef"}}); !slices.Equal(parts, []string{"0123456789", "abcdef"}) {
		t.Errorf("delivery.prepare: %q", parts)
	}
	if got := h.PresentResultAt(ctx, "s", pin(), hooks.PresentInput{Session: "s", Text: "status: ok"}); got != "presented: status: ok" {
		t.Errorf("result.present: %q", got)
	}
	// Every fallback is counted per slot.
	for _, st := range h.Stats() {
		switch st.Slot {
		case hooks.SlotTurnPrepare, hooks.SlotTurnNext, hooks.SlotExecutionReview, hooks.SlotContextPrepare, hooks.SlotDeliveryPrepare, hooks.SlotResultPresent:
			if st.Fallbacks < int64(len(bad)) || st.Invocations <= st.Fallbacks {
				t.Errorf("stats %s: %+v", st.Slot, st)
			}
		}
	}
}

// execution.review fails closed when the release requires it.
func TestRequiredExecutionReviewFailsClosed(t *testing.T) {
	f := newFixture(t, time.Second)
	ctx := context.Background()
	if _, err := f.svc.Boot(ctx, "s", f.publishWith(t, misbehave, "[hooks]\nrequired = [\"execution.review\"]\n")); err != nil {
		t.Fatal(err)
	}
	s, _ := f.st.Session(ctx, "s")
	pin := &store.Pin{Epoch: s.BehaviorEpoch, Release: s.PolicyRevision}
	for _, m := range bad {
		if d := f.hk.ReviewExecutionAt(ctx, "s", pin, hooks.ExecutionInput{Session: "s", Code: m}); d.Allow || !d.Fallback || !strings.Contains(d.Reason, "required") {
			t.Errorf("required execution.review %s: %+v, want held", m, d)
		}
	}
	if d := f.hk.ReviewExecutionAt(ctx, "s", pin, hooks.ExecutionInput{Session: "s", Code: "print(1)"}); !d.Allow {
		t.Errorf("good cell: %+v", d)
	}
	// A release that requires it without binding it is refused at activation.
	noReview := `SLOTS = {"attention.plan": lambda i: {"order": [x["id"] for x in i["items"]], "defer": [], "reason": ""},
         "delivery.review": lambda i: {"decision": "allow", "reason": "ok"}}`
	if _, err := f.svc.Activate(ctx, "s", s.BehaviorEpoch, f.publishWith(t, noReview, "[hooks]\nrequired = [\"execution.review\"]\n"), "t"); err == nil ||
		!strings.Contains(err.Error(), "execution.review") {
		t.Fatalf("activation requiring an unbound execution.review: %v", err)
	}
	// So is a binding naming an observer SLOTS lacks, or a malformed one.
	for _, settings := range []string{
		"[[hooks.observers]]\nhandler = \"nope\"\nevents = [\"input.accepted\"]\n",
		"[[hooks.observers]]\nhandler = \"turn.next\"\nevents = [\"turn.next\"]\n",
		"[hooks.transforms]\n\"turn.next\" = [\"x\"]\n",
		"[hooks]\nrequired = [\"context.prepare\"]\n",
	} {
		if _, err := f.svc.Activate(ctx, "s", s.BehaviorEpoch, f.publishWith(t, misbehave, settings), "t"); err == nil {
			t.Errorf("activation with %q was not refused", settings)
		}
	}
}

// A release without the optional slots gets the host defaults, asking each
// slot once at most.
func TestUnboundSlotsGetDefaults(t *testing.T) {
	f := newFixture(t, time.Second)
	ctx := context.Background()
	if _, err := f.svc.Boot(ctx, "s", f.publish(t, allowHooks, "# soul\n")); err != nil {
		t.Fatal(err)
	}
	s, _ := f.st.Session(ctx, "s")
	pin := &store.Pin{Epoch: s.BehaviorEpoch, Release: s.PolicyRevision}
	for range 3 {
		if n := f.hk.NextAt(ctx, "s", pin, hooks.NextInput{}); n.Decision != "continue" {
			t.Fatalf("turn.next unbound: %+v", n)
		}
		if d := f.hk.ReviewExecutionAt(ctx, "s", pin, hooks.ExecutionInput{Code: "1"}); !d.Allow {
			t.Fatalf("execution.review unbound: %+v", d)
		}
	}
	recs, _ := func() ([]store.HookInvocationRecord, error) { f.hk.Flush(); return f.st.HookInvocations(ctx, "s") }()
	asked := 0
	for _, r := range recs {
		if r.Slot == hooks.SlotTurnNext {
			asked++
		}
	}
	if asked > 1 {
		t.Errorf("an unbound turn.next was asked %d times", asked)
	}
}
