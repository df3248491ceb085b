package hooks

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/klbr-dev/klbr/internal/provider"
)

// SlotModelPlan picks the routes of a model step.
const SlotModelPlan = "model.plan"

// PlanModel runs model.plan: the routes a step tries, in order. The host
// validates the answer (one to 8 configured routes, none twice) and falls
// back to in.Default, with Fallback set, when the hook fails, times out or
// answers something else.
//
// model.plan is optional: a release whose SLOTS has none is asked once (the
// record says so), then gets the default without a round trip.
func (d *Dispatcher) PlanModel(ctx context.Context, in provider.PlanInput) provider.Plan {
	d.mu.Lock()
	pin, ok := d.pinned[in.Session]
	absent := ok && d.noModelPlan[pin.release]
	d.mu.Unlock()
	if absent {
		return provider.Plan{Routes: in.Default, Reason: "host default (the active release has no model.plan)", Fallback: true}
	}
	c := d.invoke(ctx, in.Session, SlotModelPlan, in, d.cfg.PlanDeadline)
	if c.rec.Outcome == "error" && c.rec.Release != "" && strings.Contains(c.rec.Error, ": UnknownSlot: ") {
		d.mu.Lock()
		d.noModelPlan[c.rec.Release] = true
		d.mu.Unlock()
	}
	var p provider.Plan
	var problem string
	if c.rec.Outcome != "ok" {
		problem = fmt.Sprintf("model.plan %s: %s", c.rec.Outcome, c.rec.Error)
	} else if err := json.Unmarshal(c.result, &p); err != nil {
		problem = "model.plan answered something that is not {routes, reason}"
		c.rec.Outcome = "invalid"
	} else if err := validateModelPlan(in, p); err != nil {
		problem = err.Error()
		c.rec.Outcome = "invalid"
	}
	if problem != "" {
		p = provider.Plan{Routes: in.Default, Reason: "host default (" + problem + ")", Fallback: true}
		c.rec.Error = problem
	}
	p.Fallback = problem != ""
	c.rec.Fallback = p.Fallback
	d.finish(c)
	return p
}

func validateModelPlan(in provider.PlanInput, p provider.Plan) error {
	known := map[string]bool{}
	for _, r := range in.Routes {
		known[r.Name] = true
	}
	if len(p.Routes) == 0 || len(p.Routes) > 8 {
		return fmt.Errorf("model.plan named %d routes; 1 to 8", len(p.Routes))
	}
	seen := map[string]bool{}
	for _, n := range p.Routes {
		if !known[n] {
			return fmt.Errorf("model.plan named route %q, which is not configured", n)
		}
		if seen[n] {
			return fmt.Errorf("model.plan named route %q twice", n)
		}
		seen[n] = true
	}
	return nil
}
