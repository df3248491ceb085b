package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/klbr-dev/klbr/internal/agents"
	"github.com/klbr-dev/klbr/internal/api"
	"github.com/klbr-dev/klbr/internal/hooks"
	"github.com/klbr-dev/klbr/internal/metrics"
	"github.com/klbr-dev/klbr/internal/observe"
)

// startObservers runs every session's durable observers and exposes the
// hooks' diagnostics in /metrics.
func (d *daemon) startObservers(ctx context.Context, m *metrics.Metrics) error {
	m.WatchHooks(d.slotSamples, d.observerSamples)
	if d.hooks == nil {
		return nil
	}
	d.observers = observe.New(observe.Config{Store: d.store, Hooks: d.hooks, Kick: d.ingress.Kick,
		Log: d.log.With("component", "observers"), Clock: d.clock,
		Observe: func(_, outcome string, latency time.Duration) { m.ObserverDelivery(outcome, latency) },
		Delegated: func(ctx context.Context, session, op string) (any, error) {
			child, err := agents.Delegated(ctx, d.store, session, op, "an observer bound in a child speaks only as the spawn delegated")
			if child == nil {
				return nil, err
			}
			return child, err
		}})
	sessions, err := d.store.Sessions(ctx)
	if err != nil {
		return err
	}
	for _, s := range sessions {
		d.observers.Start(s.ID)
	}
	return nil
}

func (d *daemon) slotSamples() []metrics.SlotSample {
	if d.hooks == nil {
		return nil
	}
	var out []metrics.SlotSample
	for _, s := range d.hooks.Stats() {
		kind := ""
		if sl, ok := hooks.Lookup(s.Slot); ok {
			kind = string(sl.Kind)
		}
		out = append(out, metrics.SlotSample{Slot: s.Slot, Kind: kind, Invocations: s.Invocations, Fallbacks: s.Fallbacks,
			Skipped: s.Skipped, Latency: s.Latency})
	}
	return out
}

func (d *daemon) observerSamples() []metrics.ObserverSample {
	stats, err := d.store.ObserverStats(context.Background())
	if err != nil {
		d.log.Warn("metrics: observer stats", "error", err)
		return nil
	}
	var out []metrics.ObserverSample
	for _, s := range stats {
		out = append(out, metrics.ObserverSample{Session: s.Session, Handler: s.Handler, Paused: s.Paused != "", Backlog: s.Backlog,
			Dead: s.DeadLetters, Commands: s.Commands, Refused: s.Refused, OldestPending: s.OldestPending})
	}
	return out
}

// replay is the operator API's observer replay: fake effects only.
func (d *daemon) replay(ctx context.Context, session string, req api.ReplayRequest) (api.Replay, error) {
	res := api.Replay{Session: session, Handler: req.Handler, Effects: "fake", Events: []api.Replayed{}}
	if d.observers == nil {
		return res, fmt.Errorf("observers do not run: cells cannot run")
	}
	got, err := d.observers.Replay(ctx, session, req.Handler, req.From, req.To)
	if err != nil {
		return res, err
	}
	for _, r := range got {
		e := api.Replayed{Event: r.Event, Kind: r.Kind, Problem: r.Problem, Commands: []json.RawMessage{}}
		for _, c := range r.Commands {
			b, _ := json.Marshal(c)
			e.Commands = append(e.Commands, b)
		}
		if r.State != nil {
			e.State, _ = json.Marshal(r.State)
		}
		res.Events = append(res.Events, e)
	}
	return res, nil
}
