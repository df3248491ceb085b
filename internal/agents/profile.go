package agents

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/klbr-dev/klbr/internal/budget"
	"slices"

	"github.com/klbr-dev/klbr/internal/profiles"
	"github.com/klbr-dev/klbr/internal/store"
	"github.com/klbr-dev/klbr/internal/worker"
)

// applyProfile reads profile args.Profile from release (the one the child
// is pinned to: its parent's at spawn) and applies it to the spawn: its
// route (which must be configured now), its instructions, its budget
// narrowed by the spawn's own, its delegated ops joined to the spawn's,
// and its workspace unless the spawn names one.
func (a *Agents) applyProfile(args spawnArgs, release string, c *store.NewChild) (spawnArgs, error) {
	refused := func(format string, v ...any) error {
		return &worker.RequestError{Code: "refused", Message: "agents.spawn: " + fmt.Sprintf(format, v...)}
	}
	if a.cfg.Tree == nil || release == "" {
		return args, refused("profile %q: this session has no behavior release to read profiles from", args.Profile)
	}
	p, err := profiles.Load(a.cfg.Tree(release), args.Profile)
	switch {
	case errors.Is(err, profiles.ErrNotFound):
		return args, refused("%v; profiles are profiles/<name>.toml in the behavior tree", err)
	case err != nil:
		return args, refused("profile %q: %v", args.Profile, err)
	}
	if routes := p.Routes(); len(routes) > 0 {
		err := errors.New("no model route runs (the agent is not running)")
		if a.cfg.Routes != nil {
			err = a.cfg.Routes(routes...)
		}
		if err != nil {
			return args, refused("profile %q names route %v: %v; add it to klbr.toml or change the profile", args.Profile, routes, err)
		}
	}
	own, err := budget.Parse(args.Budget) // parseSpawn checked it
	if err != nil {
		return args, invalid("agents.spawn: %v", err)
	}
	args.Budget = p.Budget.Narrow(own).JSON()
	args.Delegate = slices.Compact(slices.Sorted(slices.Values(append(slices.Clone(args.Delegate), p.Delegate...))))
	if args.Workspace == "" && p.Workspace != "" {
		args.Workspace = p.Workspace
		// The same rule as parseSpawn's for a spawn's own workspace.
		if !validWorkspace(args.Workspace) {
			return args, invalid("agents.spawn: profile %q: workspace is \"shared\", \"worktree\" or \"read_only\", not %q", p.Name, args.Workspace)
		}
	}
	if args.Host == "" {
		args.Host = p.Host
	}
	c.Budget, c.Delegate = args.Budget, args.Delegate
	c.Profile, c.Route, c.Fallback, c.Instructions = p.Name, p.Route, p.Fallback, p.Instructions
	return args, nil
}

// listProfiles answers agents.profiles: the profiles of the caller's
// release.
func (a *Agents) listProfiles(ctx context.Context, session, release string) (json.RawMessage, error) {
	if release == "" {
		if s, err := a.cfg.Store.Session(ctx, session); err == nil {
			release = s.PolicyRevision
		}
	}
	ps := []profiles.Profile{}
	if a.cfg.Tree != nil && release != "" {
		var err error
		if ps, err = profiles.List(a.cfg.Tree(release)); err != nil {
			return nil, &worker.RequestError{Code: "failed", Message: "agents.profiles: " + err.Error()}
		}
	}
	return json.Marshal(map[string]any{"release": release, "profiles": ps})
}
