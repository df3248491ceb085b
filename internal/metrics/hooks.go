package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// SlotSample is one hook slot's counts since klbr-core started.
type SlotSample struct {
	Slot        string
	Kind        string
	Invocations int64
	Fallbacks   int64
	Skipped     int64 // the default applied without asking (unbound)
	Latency     time.Duration
}

// ObserverSample is one observer binding's diagnostics.
type ObserverSample struct {
	Session, Handler string
	Paused           bool
	Backlog, Dead    int64
	Commands         int64
	Refused          int64
	OldestPending    time.Duration
}

var (
	slotInvocationsDesc = prometheus.NewDesc("klbr_hook_slot_invocations_total",
		"Hook invocations since klbr-core started, by slot and kind (decision, transform, observer).", []string{"slot", "kind"}, nil)
	slotFallbacksDesc = prometheus.NewDesc("klbr_hook_slot_fallbacks_total",
		"Invocations whose answer the host could not use (the hook failed, timed out or answered nonsense), by slot.", []string{"slot", "kind"}, nil)
	slotSkippedDesc = prometheus.NewDesc("klbr_hook_slot_defaults_total",
		"Times the host applied a slot's default without asking (the release does not bind it), by slot.", []string{"slot", "kind"}, nil)
	slotLatencyDesc = prometheus.NewDesc("klbr_hook_slot_latency_seconds_total",
		"Summed latency of a slot's invocations (divide by klbr_hook_slot_invocations_total for the mean).", []string{"slot", "kind"}, nil)
	observerBacklogDesc = prometheus.NewDesc("klbr_observer_backlog",
		"Pending deliveries of each observer binding.", []string{"session", "handler"}, nil)
	observerOldestDesc = prometheus.NewDesc("klbr_observer_oldest_pending_seconds",
		"Age of each observer binding's oldest pending delivery (0: none).", []string{"session", "handler"}, nil)
	observerDeadDesc = prometheus.NewDesc("klbr_observer_dead_letters",
		"Deliveries an observer gave up on after its retries.", []string{"session", "handler"}, nil)
	observerCommandsDesc = prometheus.NewDesc("klbr_observer_commands_total",
		"Commands observers proposed, by binding and whether the loop limits refused them.", []string{"session", "handler", "result"}, nil)
	observerPausedDesc = prometheus.NewDesc("klbr_observer_paused",
		"1 while an observer binding is paused (its state's schema version changed without a declared migration).", []string{"session", "handler"}, nil)
)

type hooksCollector struct {
	slots     func() []SlotSample
	observers func() []ObserverSample
}

func (c hooksCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{slotInvocationsDesc, slotFallbacksDesc, slotSkippedDesc, slotLatencyDesc,
		observerBacklogDesc, observerOldestDesc, observerDeadDesc, observerCommandsDesc, observerPausedDesc} {
		ch <- d
	}
}

func (c hooksCollector) Collect(ch chan<- prometheus.Metric) {
	for _, s := range c.slots() {
		ch <- prometheus.MustNewConstMetric(slotInvocationsDesc, prometheus.CounterValue, float64(s.Invocations), s.Slot, s.Kind)
		ch <- prometheus.MustNewConstMetric(slotFallbacksDesc, prometheus.CounterValue, float64(s.Fallbacks), s.Slot, s.Kind)
		ch <- prometheus.MustNewConstMetric(slotSkippedDesc, prometheus.CounterValue, float64(s.Skipped), s.Slot, s.Kind)
		ch <- prometheus.MustNewConstMetric(slotLatencyDesc, prometheus.CounterValue, s.Latency.Seconds(), s.Slot, s.Kind)
	}
	for _, o := range c.observers() {
		paused := 0.0
		if o.Paused {
			paused = 1
		}
		ch <- prometheus.MustNewConstMetric(observerBacklogDesc, prometheus.GaugeValue, float64(o.Backlog), o.Session, o.Handler)
		ch <- prometheus.MustNewConstMetric(observerOldestDesc, prometheus.GaugeValue, o.OldestPending.Seconds(), o.Session, o.Handler)
		ch <- prometheus.MustNewConstMetric(observerDeadDesc, prometheus.GaugeValue, float64(o.Dead), o.Session, o.Handler)
		ch <- prometheus.MustNewConstMetric(observerCommandsDesc, prometheus.CounterValue, float64(o.Commands-o.Refused), o.Session, o.Handler, "minted")
		ch <- prometheus.MustNewConstMetric(observerCommandsDesc, prometheus.CounterValue, float64(o.Refused), o.Session, o.Handler, "refused")
		ch <- prometheus.MustNewConstMetric(observerPausedDesc, prometheus.GaugeValue, paused, o.Session, o.Handler)
	}
}

// WatchHooks exposes per-slot counts and observer diagnostics, read at scrape time.
func (m *Metrics) WatchHooks(slots func() []SlotSample, observers func() []ObserverSample) {
	m.reg.MustRegister(hooksCollector{slots: slots, observers: observers})
	for _, s := range slots() {
		m.hooks.WithLabelValues(s.Slot, "ok") // each slot's latency at 0 before its first call
	}
	m.observerLatency = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "klbr_observer_delivery_seconds",
		Help:    "Time from an event's commit to its observer's answer, by outcome (ok, failed, dead).",
		Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 60},
	}, []string{"outcome"})
	m.reg.MustRegister(m.observerLatency)
}

// ObserverDelivery records one delivery's latency from commit to answer.
func (m *Metrics) ObserverDelivery(outcome string, latency time.Duration) {
	if m.observerLatency != nil {
		m.observerLatency.WithLabelValues(outcome).Observe(latency.Seconds())
	}
}
