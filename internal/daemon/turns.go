package daemon

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/klbr-dev/klbr/internal/config"
	"github.com/klbr-dev/klbr/internal/metrics"
	"github.com/klbr-dev/klbr/internal/provider"
	"github.com/klbr-dev/klbr/internal/store"
	"github.com/klbr-dev/klbr/internal/turn"
)

// recoverTurns closes what a previous run left open in the turn loop and
// returns the sessions to resume.
func (d *daemon) recoverTurns(ctx context.Context) (map[string]bool, error) {
	var rec store.Recovered
	if err := d.store.Write(ctx, func(tx *store.Tx) (err error) {
		rec, err = tx.RecoverTurns()
		return err
	}); err != nil {
		return nil, err
	}
	if rec.Attempts > 0 || rec.Calls > 0 || len(rec.Sessions) > 0 {
		d.log.Warn("attempts of a previous run were interrupted; they resume as new attempts",
			"attempts", rec.Attempts, "tool_calls_closed", rec.Calls, "sessions", rec.Sessions)
	}
	resume := map[string]bool{}
	for _, s := range rec.Sessions {
		resume[s] = true
	}
	return resume, nil
}

// startTurns starts every session's turn loop, when a model route is
// configured and cells can run; otherwise it says why the agent does not
// run (inputs are still admitted and kept).
func (d *daemon) startTurns(ctx context.Context, cfg *config.Config, m *metrics.Metrics, resume map[string]bool) error {
	m.WatchAgent(func() bool { return d.turns != nil }, d.backoffs)
	m.WatchStorage(func() bool { return d.store.Fault() != nil })
	route, ok := cfg.File.AgentRoute()
	switch {
	case d.bench == nil || d.hooks == nil:
		d.agent = "not running: cells cannot run"
		return nil
	case !ok:
		d.agent = fmt.Sprintf("not running: no [routes.%s] in %s; inputs are admitted and kept", cfg.File.Agent.Route, cfg.Paths.ConfigFile)
		d.log.Warn("the agent does not run: no model route is configured", "route", cfg.File.Agent.Route, "config", cfg.Paths.ConfigFile)
		return nil
	}
	client, err := provider.New(route, provider.Options{Logger: d.log.With("component", "provider", "route", cfg.File.Agent.Route)})
	if err != nil {
		// The daemon serves without a model: inputs are admitted and kept,
		// and status, the browser and the log say why nothing answers.
		d.agent = fmt.Sprintf("not running: route %s cannot be built: %v; fix %s and restart klbr-core; inputs are admitted and kept",
			cfg.File.Agent.Route, err, cfg.Paths.ConfigFile)
		d.log.Error("the agent does not run: its model route cannot be built", "route", cfg.File.Agent.Route, "error", err)
		return nil
	}
	a := cfg.File.Agent
	m.PrepareRoute(a.Route)
	m.WatchDeltas(d.deltas)
	d.turns = turn.New(turn.Config{
		Store: d.store, Sessions: d.sessions, Bench: d.bench, Planner: d.hooks, Model: client, Route: a.Route,
		URL: route.URL, ModelName: route.Model,
		Prompt: releasePrompt(d.releases.Tree), Deltas: d.deltas, Clock: d.clock, Log: d.log.With("component", "turn"),
		Budgets: turn.Budgets{MaxSteps: a.MaxSteps, MaxTokens: a.MaxTokens, MaxTurn: time.Duration(a.MaxTurnSeconds) * time.Second,
			MaxEmpty: a.MaxEmptyCompletions, MaxErrors: a.MaxConsecutiveErrors, ContextTokens: a.ContextBudgetTokens,
			ErrorBackoff: time.Duration(a.RetryBackoffMillis) * time.Millisecond,
			MaxBackoff:   time.Duration(a.MaxRetryBackoffMillis) * time.Millisecond},
		Observe:      m.ObserveModel,
		QuietAmbient: !cfg.File.Discord.AmbientWake,
	})
	d.agent = fmt.Sprintf("route %s (%s)", a.Route, route.Model)
	sessions, err := d.store.Sessions(ctx)
	if err != nil {
		return err
	}
	for _, s := range sessions {
		d.turns.Start(s.ID, resume[s.ID])
	}
	return nil
}

// releasePrompt reads a release's system prompt: its soul, then its
// instructions. Releases are immutable, so each is read once.
func releasePrompt(tree func(id string) string) turn.Prompt {
	var mu sync.Mutex
	cache := map[string]string{}
	return func(_ context.Context, release string) (string, error) {
		if release == "" {
			return "", fmt.Errorf("the session has no active release")
		}
		mu.Lock()
		defer mu.Unlock()
		if p, ok := cache[release]; ok {
			return p, nil
		}
		var parts []string
		for _, name := range []string{"soul.md", "instructions.md"} {
			b, err := os.ReadFile(filepath.Join(tree(release), name))
			if err != nil {
				if os.IsNotExist(err) {
					continue
				}
				return "", err
			}
			parts = append(parts, strings.TrimSpace(string(b)))
		}
		p := strings.Join(parts, "\n\n")
		cache[release] = p
		return p, nil
	}
}

// backoffs lists the sessions' retries and backoffs, for /metrics.
func (d *daemon) backoffs() []metrics.Backoff {
	if d.turns == nil {
		return nil
	}
	var out []metrics.Backoff
	for id, r := range d.turns.Backoffs() {
		out = append(out, metrics.Backoff{Session: id, State: r.State, NextAt: r.NextAt, InARow: r.InARow})
	}
	return out
}
