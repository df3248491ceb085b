package activation

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/provider"
	"github.com/klbr-dev/klbr/internal/store"
)

const planHooks = `
def review(inp):
    return {"decision": "allow", "reason": "fine"}
def plan(inp):
    return {"order": [i["id"] for i in inp["items"]], "defer": [], "reason": "in order"}
def model_plan(inp):
    if inp["purpose"] == "summary":
        return {"routes": ["cheap"], "reason": "summaries go cheap"}
    if inp["purpose"] == "test":
        return {"routes": ["nowhere"], "reason": "a route that is not configured"}
    if inp["directed"]:
        raise RuntimeError("a bug in the policy")
    return {"routes": inp["default"], "reason": "default"}
SLOTS = {"delivery.review": review, "attention.plan": plan, "model.plan": model_plan}
`

func planInput(purpose string, directed bool) provider.PlanInput {
	return provider.PlanInput{RequestMeta: provider.RequestMeta{Session: "s", Purpose: purpose, Directed: directed},
		Routes:  []provider.RouteInfo{{Name: "main", Model: "big"}, {Name: "cheap", Model: "small"}},
		Default: []string{"main"}}
}

// TestModelPlan: the hook's valid answer is followed; one that raises or
// names a route that is not configured gets the default plan, with the
// reason, and each invocation is recorded.
func TestModelPlan(t *testing.T) {
	f := newFixture(t, 2*time.Second)
	ctx := context.Background()
	if _, err := f.svc.Boot(ctx, "s", f.publish(t, planHooks, "# soul\n")); err != nil {
		t.Fatal(err)
	}
	if p := f.hk.PlanModel(ctx, planInput("summary", false)); p.Fallback || len(p.Routes) != 1 || p.Routes[0] != "cheap" || p.Reason != "summaries go cheap" {
		t.Errorf("valid answer: %+v", p)
	}
	if p := f.hk.PlanModel(ctx, planInput("turn", false)); p.Fallback || p.Routes[0] != "main" {
		t.Errorf("default answer: %+v", p)
	}
	for _, tc := range []struct {
		in   provider.PlanInput
		want string
	}{
		{planInput("turn", true), "a bug in the policy"},
		{planInput("test", false), `route "nowhere", which is not configured`},
	} {
		p := f.hk.PlanModel(ctx, tc.in)
		if !p.Fallback || len(p.Routes) != 1 || p.Routes[0] != "main" || !strings.Contains(p.Reason, tc.want) {
			t.Errorf("%+v: %+v", tc.in.RequestMeta, p)
		}
	}
	invs, err := func() ([]store.HookInvocationRecord, error) { f.hk.Flush(); return f.st.HookInvocations(ctx, "s") }()
	if err != nil {
		t.Fatal(err)
	}
	outcomes := map[string]int{}
	for _, inv := range invs {
		if inv.Slot == "model.plan" {
			outcomes[inv.Outcome]++
			if inv.Fallback != (inv.Outcome != "ok") {
				t.Errorf("record %+v", inv)
			}
		}
	}
	if outcomes["ok"] != 2 || outcomes["error"] != 1 || outcomes["invalid"] != 1 {
		t.Errorf("recorded: %v", outcomes)
	}
}

// TestModelPlanAbsent: a release without model.plan is asked once, then
// gets the default plan without a round trip.
func TestModelPlanAbsent(t *testing.T) {
	f := newFixture(t, 2*time.Second)
	ctx := context.Background()
	if _, err := f.svc.Boot(ctx, "s", f.publish(t, allowHooks, "# soul\n")); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if p := f.hk.PlanModel(ctx, planInput("turn", false)); !p.Fallback || p.Routes[0] != "main" {
			t.Fatalf("%+v", p)
		}
	}
	invs, _ := func() ([]store.HookInvocationRecord, error) { f.hk.Flush(); return f.st.HookInvocations(ctx, "s") }()
	n := 0
	for _, inv := range invs {
		if inv.Slot == "model.plan" {
			n++
			if !strings.Contains(inv.Error, "UnknownSlot") {
				t.Errorf("record %+v", inv)
			}
		}
	}
	if n != 1 {
		t.Errorf("%d model.plan invocations recorded, want 1", n)
	}
}
