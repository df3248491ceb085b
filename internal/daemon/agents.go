package daemon

import (
	"context"
	"errors"
	"time"

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
	var tree func(string) string // profiles are read from the release a child is pinned to
	if d.releases != nil {
		tree = d.releases.Tree
	}
	bench := d.bench
	acfg := agents.Config{Store: d.store, Jobs: d.jobs, Clock: d.clock, Tree: tree, Workspaces: d.bench.Config().Workspaces,
		GrantRef: d.history(cfg).GrantRef, Log: d.log.With("component", "agents"),
		Limits: store.ChildLimits{MaxDepth: l.MaxDepth, MaxDescendants: l.MaxDescendants, MaxConcurrent: l.MaxConcurrent,
			MaxTreeTokens: l.MaxTreeTokens, MaxSpawnsPerTree: l.MaxSpawnsPerTree, MaxSpawnsPerDay: l.MaxSpawnsPerDay, Day: d.spawnDay(cfg)},
		MaxChildWall: time.Duration(l.MaxChildWallSeconds) * time.Second,
		// A profile's routes must be configured in the running klbr.toml.
		Routes: func(names ...string) error {
			if d.routeTable() == nil {
				return errors.New("no model route runs: " + d.agentState())
			}
			return d.routeTable().Has(names...)
		},
		// An ended child's kernel is stopped: a cancelled or exhausted
		// child's session was stopped first, which cuts off a running cell;
		// a finished child's last cell ends by itself. The reset then takes
		// the cell's turn and kills the generation.
		StopKernel: func(session, reason string) {
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				if err := bench.ResetAfterCell(ctx, session, reason); err != nil {
					d.log.Warn("could not stop an ended child's kernel", "session", session, "error", err)
				}
			}()
		},
		Start: func(session string) {
			if d.turnLoop() != nil {
				d.turnLoop().Start(session, false)
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
	// The operator's stop of a session cancels its running children.
	d.sessions.OnStop(a.Stopped)
	return a
}
