package hooks

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"

	"github.com/klbr-dev/klbr/internal/store"
)

// PlanItem is one input waiting for attention.
type PlanItem struct {
	ID           int64   `json:"id"`
	SourceKind   string  `json:"source_kind"` // operator, discord, job or source
	Directed     bool    `json:"directed"`    // a DM or a mention
	Conversation string  `json:"conversation"`
	ReceivedAt   float64 `json:"received_at"` // unix seconds
}

// PlanInput is what attention.plan orders.
type PlanInput struct {
	Items []PlanItem `json:"items"`
	Now   float64    `json:"now"`
}

// Deferral puts an item off until a time.
type Deferral struct {
	ID    int64   `json:"id"`
	Until float64 `json:"until"`
}

// Plan is attention.plan's answer, validated by the host.
type Plan struct {
	Order    []int64    `json:"order"`
	Defer    []Deferral `json:"defer"`
	Reason   string     `json:"reason"`
	Fallback bool       `json:"fallback"`
}

// AmbientDefer is the host default's ambient batching delay.
const AmbientDefer = 8.0

// DefaultPlan is the host's documented default, used when the hook fails:
// the same rule as the shipped attention.plan. Operator inputs first, oldest
// first; then directed inputs, then ambient inputs once 8 s old (younger
// ones are deferred until then); among directed and among ambient inputs,
// conversations take turns, each oldest first.
func DefaultPlan(in PlanInput) Plan {
	var operator, directed, due []PlanItem
	p := Plan{Order: []int64{}, Defer: []Deferral{}, Reason: "host default: operator, then directed, then ambient after 8 s; conversations take turns"}
	for _, it := range in.Items {
		switch {
		case it.SourceKind == "operator":
			operator = append(operator, it)
		case it.Directed:
			directed = append(directed, it)
		case in.Now < it.ReceivedAt+AmbientDefer:
			p.Defer = append(p.Defer, Deferral{ID: it.ID, Until: it.ReceivedAt + AmbientDefer})
		default:
			due = append(due, it)
		}
	}
	for _, it := range oldestFirst(operator) {
		p.Order = append(p.Order, it.ID)
	}
	for _, group := range [][]PlanItem{directed, due} {
		for _, it := range takingTurns(group) {
			p.Order = append(p.Order, it.ID)
		}
	}
	sort.SliceStable(p.Defer, func(i, j int) bool {
		if p.Defer[i].Until != p.Defer[j].Until {
			return p.Defer[i].Until < p.Defer[j].Until
		}
		return p.Defer[i].ID < p.Defer[j].ID
	})
	return p
}

func oldestFirst(items []PlanItem) []PlanItem {
	out := append([]PlanItem(nil), items...)
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].ReceivedAt != out[j].ReceivedAt {
			return out[i].ReceivedAt < out[j].ReceivedAt
		}
		return out[i].ID < out[j].ID
	})
	return out
}

// takingTurns orders items one per conversation per round, each
// conversation oldest first, conversations in the order of their oldest.
func takingTurns(items []PlanItem) []PlanItem {
	var convs []string
	queues := map[string][]PlanItem{}
	for _, it := range oldestFirst(items) {
		if _, ok := queues[it.Conversation]; !ok {
			convs = append(convs, it.Conversation)
		}
		queues[it.Conversation] = append(queues[it.Conversation], it)
	}
	out := make([]PlanItem, 0, len(items))
	for len(out) < len(items) {
		for _, c := range convs {
			if q := queues[c]; len(q) > 0 {
				out = append(out, q[0])
				queues[c] = q[1:]
			}
		}
	}
	return out
}

// Plan runs attention.plan and validates its answer: every item is either
// ordered or deferred exactly once, and no operator input is deferred or
// put after a non-operator one. On any failure it returns DefaultPlan with
// Fallback set.
func (d *Dispatcher) Plan(ctx context.Context, session string, in PlanInput) Plan {
	return d.PlanAt(ctx, session, nil, in)
}

// PlanAt plans under the behavior pinned at pin (a running attempt's), or
// the active one when pin is nil.
func (d *Dispatcher) PlanAt(ctx context.Context, session string, pin *store.Pin, in PlanInput) Plan {
	c := d.invokeAt(ctx, session, pin, SlotPlan, in, d.cfg.PlanDeadline)
	var p Plan
	var problem string
	if c.rec.Outcome != "ok" {
		problem = fmt.Sprintf("attention.plan %s: %s", c.rec.Outcome, c.rec.Error)
	} else if err := json.Unmarshal(c.result, &p); err != nil {
		problem = "attention.plan answered something that is not {order, defer, reason}"
		c.rec.Outcome = "invalid"
	} else if err := validatePlan(in, p); err != nil {
		problem = err.Error()
		c.rec.Outcome = "invalid"
	}
	if problem != "" {
		p = DefaultPlan(in)
		p.Fallback = true
		p.Reason = "host default (" + problem + ")"
		c.rec.Error = problem
	}
	c.rec.Fallback = p.Fallback
	d.finish(c)
	return p
}

func validatePlan(in PlanInput, p Plan) error {
	kind := map[int64]string{}
	for _, it := range in.Items {
		kind[it.ID] = it.SourceKind
	}
	seen := map[int64]bool{}
	mark := func(id int64) error {
		if _, ok := kind[id]; !ok {
			return fmt.Errorf("attention.plan named input %d, which it was not given", id)
		}
		if seen[id] {
			return fmt.Errorf("attention.plan placed input %d twice", id)
		}
		seen[id] = true
		return nil
	}
	nonOperatorSeen := false
	for _, id := range p.Order {
		if err := mark(id); err != nil {
			return err
		}
		if kind[id] == "operator" && nonOperatorSeen {
			return fmt.Errorf("attention.plan put operator input %d after other input", id)
		}
		nonOperatorSeen = nonOperatorSeen || kind[id] != "operator"
	}
	for _, df := range p.Defer {
		if err := mark(df.ID); err != nil {
			return err
		}
		if kind[df.ID] == "operator" {
			return fmt.Errorf("attention.plan deferred operator input %d", df.ID)
		}
	}
	if len(seen) != len(kind) {
		return fmt.Errorf("attention.plan left %d inputs out", len(kind)-len(seen))
	}
	return nil
}
