package daemon

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/klbr-dev/klbr/internal/artifacts"
	"github.com/klbr-dev/klbr/internal/config"
	"github.com/klbr-dev/klbr/internal/history"
	"github.com/klbr-dev/klbr/internal/hooks"
	"github.com/klbr-dev/klbr/internal/metrics"
	"github.com/klbr-dev/klbr/internal/provider"
	"github.com/klbr-dev/klbr/internal/spend"
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
// run (inputs are still admitted and kept) and a reload that gives it a
// route starts it (startAgent).
func (d *daemon) startTurns(ctx context.Context, cfg *config.Config, m *metrics.Metrics, resume map[string]bool) error {
	m.WatchAgent(func() bool { return d.turnLoop() != nil }, d.backoffs)
	m.WatchStorage(func() bool { return d.store.Fault() != nil })
	_, err := d.startAgent(ctx, cfg, resume)
	return err
}

// startAgent builds the agent's parts from cfg (the spend meter, the
// routes, the compactor, the turn loop), then publishes them and starts
// every session's loop. It says why the agent does not run, and returns
// false, when cells cannot run or cfg names no usable route; an error is
// a failure before anything was published. d.reloadMu held, or at the
// start before serving.
func (d *daemon) startAgent(ctx context.Context, cfg *config.Config, resume map[string]bool) (bool, error) {
	m := d.metrics
	route, ok := cfg.File.AgentRoute()
	switch {
	case d.bench == nil || d.hooks == nil:
		d.setAgent("not running: cells cannot run")
		return false, nil
	case !ok:
		d.setAgent(fmt.Sprintf("not running: no [routes.%s] in %s; inputs are admitted and kept; add it and run klbr-core reload", cfg.File.Agent.Route, cfg.Paths.ConfigFile))
		d.log.Warn("the agent does not run: no model route is configured", "route", cfg.File.Agent.Route, "config", cfg.Paths.ConfigFile)
		return false, nil
	}
	a := cfg.File.Agent
	mtr, sink, err := d.newMeter(ctx, cfg)
	if err != nil {
		return false, err
	}
	model, err := d.router(cfg, m, mtr)
	if err != nil {
		// The daemon serves without a model: inputs are admitted and kept,
		// and status, the browser and the log say why nothing answers.
		d.setAgent(fmt.Sprintf("not running: %v; fix %s and run klbr-core reload; inputs are admitted and kept", err, cfg.Paths.ConfigFile))
		d.log.Error("the agent does not run: its model route cannot be built", "error", err)
		return false, nil
	}
	compactor, est, err := d.newCompactor(ctx, cfg, model, m, mtr)
	if err != nil {
		return false, err
	}
	// [agents] model_slots: children never take the last model request slot.
	slots := turn.NewSlots(cfg.File.Agents.Resolved().ModelSlots)
	var check func(context.Context, string) error
	var reserve func(context.Context, string, provider.Request) (func(), error)
	if d.agents != nil {
		check = d.agents.Check // a child's budget, before each of its requests
		reserve = d.treeReserve(cfg)
	}
	tracer, err := d.startTracing(ctx, cfg)
	if err != nil {
		return false, err
	}
	loop := turn.New(turn.Config{
		Slots: slots, Check: check, Reserve: reserve, Tracer: tracer,
		Store: d.store, Sessions: d.sessions, Bench: d.bench, Planner: d.hooks, Policy: d.hooks, Model: model, Route: a.Route,
		URL: route.URL, ModelName: route.Model,
		Prompt: releasePrompt(d.releases.Tree), Index: d.skillIndex, Maintenance: d.maintenanceSkill, Deltas: d.deltas, Clock: d.clock, Log: d.log.With("component", "turn"),
		Compactor: compactor, Estimator: est, Compaction: d.hooks,
		Budgets:      budgets(a),
		Observe:      m.ObserveModel,
		QuietAmbient: !cfg.File.Discord.AmbientWake,
		Images:       d.readImage, Vision: vision(cfg.File),
	})
	if d.agents != nil {
		loop.SetIdle(d.agents.Idle)
	}

	// Published: from here the agent runs.
	d.meter.Store(mtr)
	d.agentFile = cfg.File
	d.watchSpend(m, mtr, sink, model.Names())
	d.routes.Store(model)
	m.WatchRouter(model)
	m.WatchDeltas(d.deltas)
	d.turns.Store(loop)
	m.WatchModelSlots(func() metrics.ModelSlots {
		s := slots.Stats()
		return metrics.ModelSlots{Size: s.Size, Roots: s.Roots, Children: s.Children, WaitingRoots: s.WaitingRoots,
			WaitingChildren: s.WaitingChildren, ChildrenWaited: s.ChildrenWaited}
	})
	m.WatchContext(func() []metrics.ContextSample {
		var out []metrics.ContextSample
		for id, st := range loop.ContextStates() {
			out = append(out, metrics.ContextSample{Session: id, Tokens: st.Tokens, Budget: st.Budget, Threshold: st.Threshold,
				Compactions: st.Compactions, Degraded: st.Degraded})
		}
		return out
	})
	m.PrepareSummary(compactorRoute(a))
	seed := cfg.File.SeedNote(cfg.Paths.ConfigFile)
	if seed != "" {
		d.log.Warn(seed)
	}
	d.setAgent(agentLine(a, route, seed))
	sessions, err := d.store.Sessions(ctx)
	if err != nil {
		return true, err
	}
	for _, s := range sessions {
		loop.Start(s.ID, resume[s.ID])
	}
	return true, nil
}

// history returns the history reader over the store and the artifacts.
func (d *daemon) history(cfg *config.Config) *history.Reader {
	r := &history.Reader{Store: d.store, Grants: func(ctx context.Context, caller string) (history.Grant, bool) {
		// A child agent reads the refs and scopes its spawn granted it,
		// of its parent's history (the job's owner).
		j, err := d.store.ChildJobOf(ctx, caller)
		if err != nil {
			return history.Grant{}, false
		}
		spec, err := store.ChildSpecOf(j)
		if err != nil {
			return history.Grant{}, false
		}
		return history.ParseGrant(j.Session, spec.Refs), true
	}}
	if arts, err := artifacts.New(filepath.Join(cfg.Paths.DataDir, "artifacts")); err == nil {
		r.Artifacts = arts
	}
	return r
}

// compact runs a manual compaction (klbr-core compact, the browser): the
// same path the turn loop takes past its threshold.
func (d *daemon) compact(ctx context.Context, session string) (history.Result, error) {
	if d.turnLoop() == nil {
		return history.Result{}, fmt.Errorf("%w: the agent is not running (%s): compaction needs its summarizer route", history.ErrUnavailable, d.agentState())
	}
	return d.turnLoop().Compact(ctx, session)
}

// newCompactor builds the history compactor: summaries are written with
// agent.summary_route (or along the agent's routes, through router), the prompt comes from
// the session's release, and sizes use the agent route's calibrated
// estimate (seeded from the recorded usage of its recent requests).
func (d *daemon) newCompactor(ctx context.Context, cfg *config.Config, router history.Model, m *metrics.Metrics, mtr *spend.Meter) (*history.Compactor, *turn.Estimator, error) {
	a := cfg.File.Agent
	est := &turn.Estimator{}
	raw, reported, err := d.store.Calibration(ctx, a.Route, 8)
	if err != nil {
		return nil, nil, err
	}
	for i := range raw {
		est.Observe(raw[i], reported[i])
	}
	name, summarizer := a.Route, router
	route, _ := cfg.File.AgentRoute()
	if a.SummaryRoute != "" && a.SummaryRoute != a.Route {
		name, route = a.SummaryRoute, cfg.File.Routes[a.SummaryRoute]
		client, err := provider.New(route, provider.Options{Logger: d.log.With("component", "provider", "route", name)})
		if err != nil {
			return nil, nil, fmt.Errorf("route %s (agent.summary_route): %w", name, err)
		}
		summarizer = metered(mtr, name, client)
	}
	return history.New(history.Config{
		Store: d.store, Model: summarizer, Route: name, ModelName: route.Model,
		Prompt:   releaseFile(d.releases.Tree, "prompts/summary.md"),
		Estimate: est.Tokens,
		Prepare: func(ctx context.Context, session string, in history.PrepareInput) string {
			return d.hooks.PrepareSummary(ctx, session, hooks.PrepareInput(in))
		},
		Timeout: time.Duration(a.SummaryTimeoutSeconds) * time.Second,
		Observe: func(outcome string) { m.ObserveSummary(name, outcome) },
		Log:     d.log.With("component", "history"),
	}), est, nil
}

func compactorRoute(a config.Agent) string {
	if a.SummaryRoute != "" {
		return a.SummaryRoute
	}
	return a.Route
}

// releaseFile reads a file of a release (a prompt), without its leading
// HTML comment (the file's note to whoever edits it).
func releaseFile(tree func(id string) string, name string) func(context.Context, string) (string, error) {
	return func(_ context.Context, release string) (string, error) {
		if release == "" {
			return "", fmt.Errorf("no release")
		}
		b, err := os.ReadFile(filepath.Join(tree(release), name))
		if err != nil {
			return "", err
		}
		s := strings.TrimSpace(string(b))
		if strings.HasPrefix(s, "<!--") {
			if _, rest, ok := strings.Cut(s, "-->"); ok {
				s = strings.TrimSpace(rest)
			}
		}
		return s, nil
	}
}

// router builds a client for every configured route and the Router that
// sends each step along its plan: agent.route, then agent.fallback, unless
// the model.plan hook answers otherwise. The agent's route must have a
// working client; another route whose key is missing is left out with a
// warning (doctor says so too).
func (d *daemon) router(cfg *config.Config, m *metrics.Metrics, mtr *spend.Meter) (*provider.Router, error) {
	a := cfg.File.Agent
	opts := provider.RouterOptions{Routes: map[string]provider.Completer{}, Info: map[string]provider.RouteInfo{},
		Clock: d.clock, Log: d.log.With("component", "router"), Observe: m.ObserveModel,
		// A route that failed transiently rests as long as a failed
		// request waits before its retry, doubling per failure in a row.
		Rest: time.Duration(a.RetryBackoffMillis) * time.Millisecond, PassedOn: d.passedOn}
	var err error
	if opts.Routes, opts.Info, err = d.buildRoutes(cfg.File, mtr); err != nil {
		return nil, err
	}
	opts.Default = cfg.File.StepRoutes()
	opts.SessionDefault = d.sessionRoutes()
	if d.hooks != nil {
		opts.Planner = d.hooks
	}
	return provider.NewRouter(opts)
}

// sessionRoutes returns a session's own default plan: a child agent's
// profile route, then its fallback, as its job's spec records them (nil:
// the agent's plan). A spec never changes, so each session is read once.
func (d *daemon) sessionRoutes() func(session string) ([]string, error) {
	var cache sync.Map // session -> []string
	return func(session string) ([]string, error) {
		if v, ok := cache.Load(session); ok {
			return v.([]string), nil
		}
		var routes []string
		j, err := d.store.ChildJobOf(context.Background(), session)
		switch {
		case errors.Is(err, store.ErrNoJob):
			// A root (no child job): the agent's plan.
		case err != nil:
			return nil, err
		default:
			spec, err := store.ChildSpecOf(j)
			if err != nil {
				return nil, err
			}
			if spec.Route != "" {
				routes = append([]string{spec.Route}, spec.Fallback...)
			}
		}
		cache.Store(session, routes)
		return routes, nil
	}
}

// releasePrompt reads a release's system prompt: its soul, then its
// instructions. Releases are immutable, so each is read once. The index of
// the skills offered with it is turn.Config.Index (d.skillIndex): managed
// skills change without a release.
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
	if d.turnLoop() == nil {
		return nil
	}
	var out []metrics.Backoff
	for id, r := range d.turnLoop().Backoffs() {
		if d.spendHold(id) != nil {
			continue
		}
		out = append(out, metrics.Backoff{Session: id, State: r.State, NextAt: r.NextAt, InARow: r.InARow})
	}
	if d.spendMeter() != nil {
		for id, h := range d.spendMeter().Holds() {
			out = append(out, metrics.Backoff{Session: id, State: RetryWaitingSpend, NextAt: h.Resets})
		}
	}
	return out
}
