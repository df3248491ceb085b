package daemon

import (
	"github.com/klbr-dev/klbr/internal/agents"
	"github.com/klbr-dev/klbr/internal/config"
	"github.com/klbr-dev/klbr/internal/store"
)

// newAgents binds agents.* in every cell: child agents are sessions of
// their own, run by the turn loop, and jobs of kind child. Without the
// jobs (cells cannot run) there are none.
func (d *daemon) newAgents(cfg *config.Config) *agents.Agents {
	if d.jobs == nil || d.bench == nil {
		return nil
	}
	l := cfg.File.Agents.Resolved()
	acfg := agents.Config{Store: d.store, Jobs: d.jobs, Clock: d.clock,
		Limits:   store.ChildLimits{MaxDepth: l.MaxDepth, MaxDescendants: l.MaxDescendants, MaxConcurrent: l.MaxConcurrent},
		GrantRef: d.history(cfg).GrantRef,
		Start: func(session string) {
			if d.turns != nil {
				d.turns.Start(session, false)
			}
			if d.observers != nil {
				d.observers.Start(session)
			}
		}}
	if d.hooks != nil {
		acfg.Plan = d.hooks.PlanJob // job.plan, asked before a spawn as before a job
	}
	a := agents.New(acfg)
	d.bench.SetOps("agents.", a)
	return a
}
