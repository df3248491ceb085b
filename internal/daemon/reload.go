package daemon

import (
	"context"
	"fmt"
	"maps"
	"os"
	"os/signal"
	"reflect"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/klbr-dev/klbr/internal/api"
	"github.com/klbr-dev/klbr/internal/config"
	"github.com/klbr-dev/klbr/internal/hosts"
	"github.com/klbr-dev/klbr/internal/localapi"
	"github.com/klbr-dev/klbr/internal/provider"
	"github.com/klbr-dev/klbr/internal/spend"
	"github.com/klbr-dev/klbr/internal/turn"
)

// Reload rereads klbr.toml (klbr-core reload, SIGHUP) and applies what can
// change while sessions run: the routes, the agent's route and fallbacks,
// its budgets, the [spend] caps, [discord] ambient_wake, the worker hosts
// (hosts.Engine.Reconfigure) and [retention] (the next gc). The next model
// request plans with the new routes; a request in flight finishes on its
// route. Everything else that changed is named in the answer's Restart.
// A file that does not parse, or whose agent route cannot be built, is
// refused (ErrConfigRefused, with the cause) and nothing changes.
func (d *daemon) Reload(ctx context.Context) (api.Reloaded, error) {
	d.reloadMu.Lock()
	defer d.reloadMu.Unlock()
	start := d.clock()
	old := d.file
	next, err := d.cfg.Reread()
	if err != nil {
		d.log.Error("reload refused: klbr.toml does not parse; the running configuration stays", "error", err)
		return api.Reloaded{}, fmt.Errorf("%w: %w", localapi.ErrConfigRefused, err)
	}
	nf := next.File
	var newHosts map[string]hosts.Host
	if d.hosts != nil {
		if newHosts, err = hosts.FromConfig(nf); err != nil {
			d.log.Error("reload refused: [hosts] cannot be used; the running configuration stays", "error", err)
			return api.Reloaded{}, fmt.Errorf("%w: %w", localapi.ErrConfigRefused, err)
		}
	}
	select {
	case <-d.closing:
		return api.Reloaded{}, fmt.Errorf("%w: klbr-core is draining; the next start reads klbr.toml", localapi.ErrConfigRefused)
	default:
	}
	out := api.Reloaded{Config: d.cfg.Paths.ConfigFile, Applied: []string{}}
	if d.turnLoop() != nil {
		if err := d.applyRoutes(nf, &out); err != nil {
			d.log.Error("reload refused: the agent's routes cannot be built; the running configuration stays", "error", err)
			return api.Reloaded{}, fmt.Errorf("%w: %w", localapi.ErrConfigRefused, err)
		}
	} else {
		// The agent did not run (no route, or one that could not be
		// built): the new file may give it one. It starts now and picks
		// up the inputs kept meanwhile.
		started, err := d.startAgent(context.WithoutCancel(ctx), next, nil)
		if err != nil {
			d.log.Error("reload refused: the agent cannot start; the running configuration stays", "error", err)
			return api.Reloaded{}, fmt.Errorf("%w: the agent cannot start: %w", localapi.ErrConfigRefused, err)
		}
		if started {
			if d.bench != nil {
				d.spendOps(next)
			}
			out.Applied = append(out.Applied, "the agent started: "+d.agentState())
			d.log.Info("the agent started at a reload", "agent", d.agentState())
		}
	}
	// What only a restart applies is compared with what the daemon, or
	// the agent, started with: it stays named at each reload until then.
	var agentFile *config.File
	if d.turnLoop() != nil {
		agentFile = &d.agentFile
	}
	out.Restart = restartNeeded(d.cfg.File, agentFile, nf, d.hosts != nil)
	if d.hosts != nil {
		if c := d.hosts.Reconfigure(newHosts); !c.Empty() {
			out.Applied = append(out.Applied, hostsApplied(c))
		}
	}
	if d.spendMeter() != nil && agentFile != nil && !reflect.DeepEqual(spendCaps(old.Spend), spendCaps(nf.Spend)) {
		caps, err := d.store.SpendCaps(ctx)
		if err != nil {
			return api.Reloaded{}, fmt.Errorf("reload: read the operator's spend caps: %w", err)
		}
		d.spendMeter().Reconfigure(nf.Spend, caps)
		note := "[spend] caps"
		if len(caps) > 0 {
			note += fmt.Sprintf(" (the operator's caps set with `klbr-core spend cap` still win: %v)", slices.Sorted(maps.Keys(caps)))
		}
		out.Applied = append(out.Applied, note)
	}
	if !reflect.DeepEqual(old.Retention, nf.Retention) {
		out.Applied = append(out.Applied, "[retention]: `klbr-core gc` reads it at each run")
	}
	d.file = nf
	d.agentMu.Lock()
	d.inForce = api.ConfigInForce{Path: d.cfg.Paths.ConfigFile, Digest: next.Digest, ReadAt: d.clock()}
	d.agentMu.Unlock()
	out.Agent = d.agentState()
	out.Seconds = d.clock().Sub(start).Seconds()
	d.log.Info("klbr.toml reloaded", "applied", out.Applied, "restart", out.Restart, "agent", out.Agent, "took", d.clock().Sub(start).Round(time.Microsecond))
	return out, nil
}

// applyRoutes builds every route of nf and puts them, the agent's plan and
// budgets in force; on an error nothing changed. d.reloadMu held.
func (d *daemon) applyRoutes(nf config.File, out *api.Reloaded) error {
	old := d.file
	if reflect.DeepEqual(old.Routes, nf.Routes) && reflect.DeepEqual(old.Agent, nf.Agent) &&
		old.Discord.AmbientWake == nf.Discord.AmbientWake {
		return nil
	}
	route, ok := nf.AgentRoute()
	if !ok {
		return fmt.Errorf("no [routes.%s] (agent.route) in the new file; add it, or name a configured route", nf.Agent.Route)
	}
	routes, info, err := d.buildRoutes(nf, d.spendMeter())
	if err != nil {
		return err
	}
	if err := d.routeTable().SetRoutes(routes, info, nf.StepRoutes()); err != nil {
		return fmt.Errorf("routes: %w", err)
	}
	a := nf.Agent
	d.turnLoop().Reconfigure(turn.Live{Route: a.Route, URL: route.URL, ModelName: route.Model,
		QuietAmbient: !nf.Discord.AmbientWake, Budgets: budgets(a), Vision: vision(nf)})
	d.setAgent(agentLine(a, route, nf.SeedNote(d.cfg.Paths.ConfigFile)))
	if !reflect.DeepEqual(old.Routes, nf.Routes) {
		out.Applied = append(out.Applied, "routes: "+routesDiff(old.Routes, nf.Routes))
	}
	if old.Agent.Route != a.Route || !slices.Equal(old.Agent.Fallback, a.Fallback) {
		out.Applied = append(out.Applied, fmt.Sprintf("agent route: %s -> %s", planString(old.StepRoutes()), planString(nf.StepRoutes())))
	}
	if budgets(old.Agent) != budgets(a) {
		out.Applied = append(out.Applied, "[agent] budgets (steps, tokens, turn time, errors, backoff, context)")
	}
	if old.Discord.AmbientWake != nf.Discord.AmbientWake {
		out.Applied = append(out.Applied, fmt.Sprintf("discord.ambient_wake = %t", nf.Discord.AmbientWake))
	}
	return nil
}

// restartNeeded names what changed between the file klbr-core started with
// (old), the one its agent started with (agent; nil while the agent does
// not run) and nf, that only a restart (of klbr-core, or of klbr-discord)
// applies. hostsLive: klbr-core runs a hosts engine, which takes [hosts]
// changes live.
func restartNeeded(old config.File, agent *config.File, nf config.File, hostsLive bool) []string {
	out := []string{}
	add := func(changed bool, what string) {
		if changed {
			out = append(out, what)
		}
	}
	if a := agent; a != nil {
		add(a.Agent.SummaryRoute != nf.Agent.SummaryRoute || a.Agent.SummaryTimeoutSeconds != nf.Agent.SummaryTimeoutSeconds,
			"agent.summary_route, agent.summary_timeout_seconds: the compactor is built when the agent starts")
		add(a.Agent.RetryBackoffMillis != nf.Agent.RetryBackoffMillis,
			"agent.retry_backoff_ms as a failed route's rest (the sessions' retries use the new value now)")
		add(!reflect.DeepEqual(prices(a.Routes), prices(nf.Routes)), "[routes.*.price]: the spend meter prices requests as when the agent started")
		add(a.Spend.TimeZone != nf.Spend.TimeZone, "spend.time_zone: the day and month boundaries are fixed when the agent starts")
		add(a.Telemetry != nf.Telemetry, "[telemetry]: the trace exporter is made when the agent starts")
	}
	add(old.Agent.Host != nf.Agent.Host, "agent.host: where the workbench runs is fixed at the start")
	add(!hostsLive && len(nf.Hosts) > 0, "[hosts]: klbr-core started with no worker hosts; the first ones take a restart")
	add(!reflect.DeepEqual(old.Limits, nf.Limits), "[limits]: the workers' scopes are set at the start")
	add(!reflect.DeepEqual(old.Jobs, nf.Jobs), "[jobs]")
	add(!reflect.DeepEqual(old.Agents, nf.Agents), "[agents]: child agents' limits and model slots")
	add(!reflect.DeepEqual(old.Browser, nf.Browser), "[browser]")
	add(old.Storage != nf.Storage, "[storage]: the data directory's bound is set at the start")
	add(old.Discord.PendingAgingSeconds != nf.Discord.PendingAgingSeconds, "discord.pending_aging_seconds")
	od, nd := old.Discord, nf.Discord
	od.AmbientWake, nd.AmbientWake = false, false
	od.PendingAgingSeconds, nd.PendingAgingSeconds = 0, 0
	add(!reflect.DeepEqual(od, nd), "[discord] channels, ingest, include_bots, token and API: klbr-discord's own: SIGHUP to it applies the channel filter (systemctl reload klbr-discord), its token and API take a restart")
	return out
}

// budgets are the turn loop's budgets of an [agent] section.
func budgets(a config.Agent) turn.Budgets {
	return turn.Budgets{MaxSteps: a.MaxSteps, MaxTokens: a.MaxTokens, MaxTurn: time.Duration(a.MaxTurnSeconds) * time.Second,
		MaxEmpty: a.MaxEmptyCompletions, MaxErrors: a.MaxConsecutiveErrors, ContextTokens: a.ContextBudgetTokens,
		ReserveOutput: a.Reserve(), CompactAt: a.CompactAt,
		ErrorBackoff: time.Duration(a.RetryBackoffMillis) * time.Millisecond,
		MaxBackoff:   time.Duration(a.MaxRetryBackoffMillis) * time.Millisecond}
}

// agentLine is the agent's state as status, doctor and the browser show it.
func agentLine(a config.Agent, route config.Route, seed string) string {
	model := route.Model
	if model == "" {
		model = "the server's model"
	}
	s := fmt.Sprintf("route %s (%s)", a.Route, model)
	if len(a.Fallback) > 0 {
		s += ", fallback " + strings.Join(a.Fallback, ", ")
	}
	if seed != "" { // the seed's default routes are in force
		s += " — " + seed
	}
	return s
}

// hostsApplied says what a reload changed of the worker hosts.
func hostsApplied(c hosts.Changes) string {
	var parts []string
	for _, p := range []struct {
		what  string
		names []string
	}{{"added", c.Added}, {"changed", c.Changed}, {"removed (no new work; running jobs finish)", c.Removed}} {
		if len(p.names) > 0 {
			parts = append(parts, p.what+" "+strings.Join(p.names, ", "))
		}
	}
	return "[hosts]: " + strings.Join(parts, "; ")
}

func planString(p []string) string { return strings.Join(p, ", then ") }

// routesDiff names the routes added, removed and changed.
func routesDiff(old, nf map[string]config.Route) string {
	var parts []string
	for _, n := range slices.Sorted(maps.Keys(nf)) {
		o, had := old[n]
		switch {
		case !had:
			parts = append(parts, "added "+n)
		case !reflect.DeepEqual(o, nf[n]):
			parts = append(parts, "changed "+n)
		}
	}
	for _, n := range slices.Sorted(maps.Keys(old)) {
		if _, ok := nf[n]; !ok {
			parts = append(parts, "removed "+n)
		}
	}
	return strings.Join(parts, ", ")
}

// prices are the routes' prices; a route without one is left out (adding
// it needs no restart: the meter counts its tokens).
func prices(rs map[string]config.Route) map[string]config.Price {
	out := map[string]config.Price{}
	for n, r := range rs {
		if r.Price != nil {
			out[n] = *r.Price
		}
	}
	return out
}

// spendCaps is the part of [spend] Reconfigure applies.
func spendCaps(s config.Spend) config.Spend {
	s.TimeZone = ""
	return s
}

// buildRoutes builds a metered client for every route of f: the agent's
// routes must build; another that cannot is left out with a warning.
func (d *daemon) buildRoutes(f config.File, mtr *spend.Meter) (map[string]provider.Completer, map[string]provider.RouteInfo, error) {
	a := f.Agent
	routes, info := map[string]provider.Completer{}, map[string]provider.RouteInfo{}
	for name, r := range f.Routes {
		client, err := provider.New(r, provider.Options{Logger: d.log.With("component", "provider", "route", name)})
		if err != nil {
			if name == a.Route || slices.Contains(a.Fallback, name) {
				return nil, nil, fmt.Errorf("route %s cannot be built: %w", name, err)
			}
			d.log.Warn("route left out: it cannot be used", "route", name, "error", err)
			continue
		}
		routes[name] = metered(mtr, name, client)
		info[name] = provider.RouteInfo{Name: name, Model: r.Model, Dialect: client.Dialect().Name}
		d.metrics.PrepareRoute(name)
	}
	return routes, info, nil
}

// agentState is the agent's line in status.
func (d *daemon) agentState() string {
	d.agentMu.Lock()
	defer d.agentMu.Unlock()
	return d.agent
}

// configInForce is the klbr.toml the daemon read last (at the start, or
// at the last reload that was not refused).
func (d *daemon) configInForce() api.ConfigInForce {
	d.agentMu.Lock()
	defer d.agentMu.Unlock()
	return d.inForce
}

func (d *daemon) setAgent(s string) {
	d.agentMu.Lock()
	defer d.agentMu.Unlock()
	d.agent = s
}

// reloadFromSignal reloads on SIGHUP: the answer goes to the log (Reload
// logs what it applied, what needs a restart, or why it refused).
func (d *daemon) reloadFromSignal(ctx context.Context) {
	_, _ = d.Reload(ctx)
}

// NotifyHangup returns the channel Options.Hangup takes: SIGHUP, delivered
// to it instead of ending the process (systemctl reload klbr-core), until
// stop.
func NotifyHangup() (ch <-chan os.Signal, stop func()) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	return hup, func() { signal.Stop(hup) }
}

// turnLoop is the sessions' turn loop, nil while the agent does not run.
func (d *daemon) turnLoop() *turn.Loop { return d.turns.Load() }

// routeTable is the turns' routes, nil while the agent does not run.
func (d *daemon) routeTable() *provider.Router { return d.routes.Load() }

// spendMeter is the spend meter, nil while the agent does not run.
func (d *daemon) spendMeter() *spend.Meter { return d.meter.Load() }
