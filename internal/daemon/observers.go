package daemon

import (
	"context"
	"time"

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
		Observe: func(_, outcome string, latency time.Duration) { m.ObserverDelivery(outcome, latency) }})
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
