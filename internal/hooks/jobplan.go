package hooks

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"unicode/utf8"

	"github.com/klbr-dev/klbr/internal/jobs"
)

// SlotJobPlan decides whether a new job is admitted, and at which priority.
const SlotJobPlan = "job.plan"

// MaxJobPriority bounds the priority job.plan may give.
const MaxJobPriority = 100

// MaxPlanHost bounds the host job.plan may choose (as a cell's host=).
const MaxPlanHost = 200

// PlanJob runs job.plan for a job the session asks for. Its answer is
// {"admit": bool, "priority": int, "reason": str, "host": str} (host
// optional: the worker host it sends the job to). When the hook fails or the
// release has none, the host's default applies: admitted at priority 0.
func (d *Dispatcher) PlanJob(ctx context.Context, session string, in jobs.PlanInput) jobs.Plan {
	c := d.invoke(ctx, session, SlotJobPlan, in, d.cfg.PlanDeadline)
	var p jobs.Plan
	problem := ""
	if c.rec.Outcome != "ok" {
		problem = fmt.Sprintf("job.plan %s: %s", c.rec.Outcome, c.rec.Error)
	} else if err := decodeJobPlan(c.result, &p); err != nil {
		problem = err.Error()
		c.rec.Outcome = "invalid"
	}
	if problem != "" {
		p = jobs.Plan{Admit: true, Reason: "host default: admitted (" + problem + ")"}
		c.rec.Error = problem
		c.rec.Fallback = true
	}
	d.finish(c)
	return p
}

func decodeJobPlan(out json.RawMessage, p *jobs.Plan) error {
	var r struct {
		Admit    *bool   `json:"admit"`
		Priority int     `json:"priority"`
		Reason   string  `json:"reason"`
		Host     *string `json:"host"`
	}
	if err := json.Unmarshal(out, &r); err != nil || r.Admit == nil {
		return fmt.Errorf("job.plan answered %s, not {admit, priority, reason[, host]}", truncate(out))
	}
	if r.Priority < -MaxJobPriority || r.Priority > MaxJobPriority {
		return fmt.Errorf("job.plan gave priority %d, outside -%d..%d", r.Priority, MaxJobPriority, MaxJobPriority)
	}
	if h := r.Host; h != nil && (*h == "" || len(*h) > MaxPlanHost || !utf8.ValidString(*h)) {
		return fmt.Errorf("job.plan gave host %s: a [hosts.NAME] or \"label:L\" of 1 to %d bytes, or none (null, or no host key) to leave the job where it asked", strconv.Quote(truncate([]byte(*h))), MaxPlanHost)
	}
	*p = jobs.Plan{Admit: *r.Admit, Priority: r.Priority, Reason: r.Reason, Host: r.Host}
	return nil
}
