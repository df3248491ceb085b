package daemon

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/klbr-dev/klbr/internal/api"
	"github.com/klbr-dev/klbr/internal/config"
	"github.com/klbr-dev/klbr/internal/metrics"
	"github.com/klbr-dev/klbr/internal/provider"
	"github.com/klbr-dev/klbr/internal/spend"
	"github.com/klbr-dev/klbr/internal/store"
	"github.com/klbr-dev/klbr/internal/turn"
)

// RetryWaitingSpend is the state a session shows while its next model
// request waits at a spend cap.
const RetryWaitingSpend = "spend_cap"

// newMeter builds the spend meter: [spend]'s caps (the operator's, where
// set, replacing them), the routes' prices and the ledger's totals of the
// current day and month. Nothing is published: watchSpend does that once
// the agent starts.
func (d *daemon) newMeter(ctx context.Context, cfg *config.Config) (*spend.Meter, *spendSink, error) {
	caps, err := d.store.SpendCaps(ctx)
	if err != nil {
		return nil, nil, err
	}
	sink := &spendSink{}
	mtr, err := spend.New(ctx, spend.Options{Spend: cfg.File.Spend, Overrides: caps, Prices: spend.PricesOf(&cfg.File),
		Used: func(ctx context.Context, since time.Time) (float64, int64, error) {
			t, err := d.store.SpendSince(ctx, since)
			return t.USD, t.Tokens, err
		},
		DefaultOut: cfg.File.Agent.Reserve(), Now: d.clock, After: d.after,
		Warn:  func(cap string, used, limit float64) { d.spendWarning(cap, used, limit) },
		Spent: sink.spent})
	if err != nil {
		return nil, nil, err
	}
	return mtr, sink, nil
}

// spendSink passes the meter's spending to /metrics once they are
// registered (watchSpend).
type spendSink struct {
	mu sync.Mutex // guards to
	to func(route, purpose string, usd float64, tokens int)
}

func (s *spendSink) spent(route, purpose string, usd float64, tokens int) {
	s.mu.Lock()
	to := s.to
	s.mu.Unlock()
	if to != nil {
		to(route, purpose, usd, tokens)
	}
}

// watchSpend exports the meter's state and spending on /metrics.
func (d *daemon) watchSpend(m *metrics.Metrics, mtr *spend.Meter, sink *spendSink, routes []string) {
	to := m.WatchSpend(func() metrics.SpendState {
		s := mtr.State()
		return metrics.SpendState{DayUSD: s.DayUSD, MonthUSD: s.MonthUSD, DayTokens: s.DayTokens, Warned: s.Warned, Held: len(s.Held)}
	}, routes)
	sink.mu.Lock()
	sink.to = to
	sink.mu.Unlock()
	m.WatchPromptCache(func() map[string]float64 {
		pc, err := d.promptCache(context.Background())
		if err != nil {
			d.log.Warn("the prompt cache ratio cannot be read from the ledger", "error", err)
		}
		out := make(map[string]float64, len(pc))
		if r := d.routeTable(); r != nil {
			for _, name := range r.Names() {
				out[name] = 0 // no prompt tokens today: none cached
			}
		}
		for _, c := range pc {
			out[c.Route] = c.HitRatio
		}
		return out
	})
}

// promptCache is each route's prompt cache today, from the ledger: the
// share of its prompt tokens the provider reported as cached. A route that
// sent no prompt tokens today is left out.
func (d *daemon) promptCache(ctx context.Context) ([]api.PromptCache, error) {
	if d.spendMeter() == nil {
		return nil, nil
	}
	s := d.spendMeter().State()
	groups, err := d.store.SpendBy(ctx, "route", s.DayStart, s.DayStart.Location())
	if err != nil {
		return nil, fmt.Errorf("prompt cache: %w", err)
	}
	var out []api.PromptCache
	for _, g := range groups {
		if g.Prompt <= 0 {
			continue
		}
		out = append(out, api.PromptCache{Route: g.Key, Prompt: g.Prompt, Cached: g.Cached,
			HitRatio: min(float64(g.Cached)/float64(g.Prompt), 1)})
	}
	return out, nil
}

// spendOps serves cells the ledger and the caps, read-only (from klbr
// import spend): spend.summary.
func (d *daemon) spendOps(cfg *config.Config) {
	loc, err := cfg.File.Spend.Location()
	if err != nil {
		d.log.Warn("cells cannot read the spend ledger", "error", err)
		return
	}
	d.bench.SetOps("spend.", spend.NewOps(d.store, loc, d.spendMeter()))
}

// spawnDay is the day agents.max_spawns_per_day counts in: [spend]
// time_zone's, as the spend caps' (the host's local time when it does
// not load).
func (d *daemon) spawnDay(cfg *config.Config) func() (time.Time, time.Time) {
	loc, err := cfg.File.Spend.Location()
	if err != nil {
		loc = time.Local
	}
	return func() (time.Time, time.Time) {
		t := d.clock().In(loc)
		s := time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, loc)
		return s, s.AddDate(0, 0, 1)
	}
}

// spendWarning writes the one notice of a cap past warn_at, in each root
// session (not shown to the model), and logs it.
func (d *daemon) spendWarning(cap string, used, limit float64) {
	d.log.Warn("spend is past [spend] warn_at of a cap", "cap", cap, "used", used, "cap_value", limit)
	ctx := context.Background()
	sessions, err := d.store.Sessions(ctx)
	if err != nil {
		return
	}
	_ = d.store.Write(ctx, func(tx *store.Tx) error {
		for _, s := range sessions {
			if s.ParentID != "" {
				continue
			}
			if _, err := tx.Notice(s.ID, "spend.warning", map[string]any{"cap": cap, "used": used, "limit": limit,
				"text": fmt.Sprintf("spend is at %.4g of the %s cap of %.4g", used, cap, limit)}, false); err != nil {
				return err
			}
		}
		return nil
	})
}

// treeReserve reserves a child's request against the budget.usd above it
// (agents.Reserve) at its largest cost: the prompt's estimate and
// agent.reserve_output_tokens at the dearest priced route (any route of
// the chain may answer it).
func (d *daemon) treeReserve(cfg *config.Config) func(context.Context, string, provider.Request) (func(), error) {
	prices, out := spend.PricesOf(&cfg.File), cfg.File.Agent.Reserve()
	return func(ctx context.Context, session string, req provider.Request) (func(), error) {
		prompt, usd := spend.EstimatePrompt(req), 0.0
		for route := range prices {
			usd = max(usd, prices.Bound(route, prompt, out))
		}
		return d.agents.Reserve(ctx, session, usd)
	}
}

// metered wraps a route's client with the spend meter (when there is one).
func metered(mtr *spend.Meter, route string, c provider.Completer) provider.Completer {
	if mtr == nil {
		return c
	}
	return mtr.Wrap(route, c)
}

// passedOn records the ledger row of a request a route failed and passed
// on to the next route: no step records it.
func (d *daemon) passedOn(meta provider.RequestMeta, route string, resp *provider.Response) {
	u := resp.Usage
	purpose := meta.Purpose
	if purpose == "" {
		purpose = "turn"
	}
	e := store.SpendEntry{Session: meta.Session, Route: route, Purpose: purpose, Prompt: deref(u.PromptTokens),
		Completion: deref(u.CompletionTokens), CacheRead: deref(u.CacheReadTokens), CacheWrite: deref(u.CacheWriteTokens),
		CostUSD: resp.CostUSD, CostSource: resp.CostSource}
	if err := d.store.Write(context.Background(), func(tx *store.Tx) error { return tx.RecordSpend(e, 0) }); err != nil {
		d.log.Warn("a passed-on request's spend could not be recorded", "route", route, "error", err)
	}
}

func deref(p *int) int {
	if p == nil {
		return 0
	}
	return *p
}

// spendHold is session's hold at a spend cap as a retry status, or nil.
func (d *daemon) spendHold(session string) *turn.Retry {
	if d.spendMeter() == nil {
		return nil
	}
	h, ok := d.spendMeter().Holds()[session]
	if !ok {
		return nil
	}
	return &turn.Retry{State: RetryWaitingSpend, NextAt: h.Resets, LastError: h.String(), LastErrorAt: h.Since,
		Fix: "wait for the period to end, or raise the cap: klbr-core spend cap daily|monthly AMOUNT"}
}
