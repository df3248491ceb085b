// Package metrics builds klbr-core's Prometheus registry. Every metric is
// registered on a registry made here and handed around; none is global.
package metrics

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"runtime"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/klbr-dev/klbr/internal/admission"
	"github.com/klbr-dev/klbr/internal/store"
	"github.com/klbr-dev/klbr/internal/version"
)

// Metrics is the daemon's registry and the instruments other parts feed.
type Metrics struct {
	reg        *prometheus.Registry
	admissions *prometheus.CounterVec
	placement  *prometheus.GaugeVec
	workers    *prometheus.CounterVec
	hooks      *prometheus.HistogramVec
	// observerLatency is set by WatchHooks.
	observerLatency *prometheus.HistogramVec
	model           *model

	backoffsMu sync.Mutex
	backoffs   func() []Backoff // set by WatchAgent
}

// New registers klbr-core's metrics, reading store-backed values from st at
// scrape time.
func New(st *store.Store, clock func() time.Time, log *slog.Logger) *Metrics {
	reg := prometheus.NewRegistry()
	m := &Metrics{
		reg: reg,
		admissions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "klbr_admissions_total",
			Help: "Inputs offered for admission, by source kind and result (accepted, duplicate, invalid, refused, error).",
		}, []string{"source_kind", "result"}),
	}
	m.placement = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "klbr_placement_mode",
		Help: "How workers are contained: 1 for the mode in force (systemd-scope, cgroup, rlimit), or none when workers cannot run.",
	}, []string{"mode"})
	m.workers = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "klbr_worker_events_total",
		Help: "Worker lifecycle events by role: started, reset (killed or died; Python state lost), start_failed.",
	}, []string{"role", "event"})
	for _, role := range []string{"workbench", "hooks"} {
		for _, e := range []string{"started", "reset", "start_failed"} {
			m.workers.WithLabelValues(role, e)
		}
	}
	m.hooks = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "klbr_hook_invocation_duration_seconds",
		Help:    "Policy hook invocations by slot and outcome (ok, error, invalid, timeout, unavailable), with their latency.",
		Buckets: []float64{.0005, .001, .002, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
	}, []string{"slot", "outcome"})
	reg.MustRegister(m.placement, m.workers, m.hooks, &behaviorCollector{st: st, log: log},
		&opsCollector{st: st, clock: clock, log: log, backoffs: m.backoffList})
	m.model = newModel(reg)
	for _, k := range []admission.SourceKind{admission.SourceOperator, admission.SourceDiscord} {
		for _, r := range []admission.Result{admission.ResultAccepted, admission.ResultDuplicate, admission.ResultInvalid, admission.ResultRefused, admission.ResultError} {
			m.admissions.WithLabelValues(string(k), string(r))
		}
	}
	info := st.Info()
	reg.MustRegister(
		m.admissions,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		&storeCollector{st: st, clock: clock, log: log},
		constInfo("klbr_build_info", "klbr-core build: version, VCS revision and Go version.",
			prometheus.Labels{"version": version.Version, "revision": version.Revision(), "goversion": runtime.Version()}),
		constInfo("klbr_sqlite_info", "The SQLite runtime klbr-core is linked with.",
			prometheus.Labels{"version": info.Version, "source_id": info.SourceID}),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "klbr_store_transactions_total",
			Help: "Write transactions of the store's writer (each is one group commit).",
		}, func() float64 { return float64(st.Stats().Batches) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "klbr_store_writes_total",
			Help: "Write functions committed by the store's writer.",
		}, func() float64 { return float64(st.Stats().Writes) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "klbr_store_write_failures_total",
			Help: "Write functions that failed or lost their commit.",
		}, func() float64 { return float64(st.Stats().Failed) }),
	)
	return m
}

func constInfo(name, help string, labels prometheus.Labels) prometheus.Collector {
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: labels})
	g.Set(1)
	return g
}

// ObserveAdmission counts one admission result; it is admission's observer.
func (m *Metrics) ObserveAdmission(kind admission.SourceKind, res admission.Result) {
	k := string(kind)
	if kind != admission.SourceOperator && kind != admission.SourceDiscord {
		k = "unknown" // never a label value an outside caller chose
	}
	m.admissions.WithLabelValues(k, string(res)).Inc()
}

// SetPlacement records the placement mode in force ("" for none).
func (m *Metrics) SetPlacement(mode string) {
	if mode == "" {
		mode = "none"
	}
	m.placement.Reset()
	m.placement.WithLabelValues(mode).Set(1)
}

// WorkerEvent counts a worker lifecycle event.
func (m *Metrics) WorkerEvent(role, event string) {
	m.workers.WithLabelValues(role, event).Inc()
}

// HookInvocation observes one policy hook invocation.
func (m *Metrics) HookInvocation(slot, outcome string, latency time.Duration) {
	m.hooks.WithLabelValues(slot, outcome).Observe(latency.Seconds())
}

// Handler serves the registry in the Prometheus exposition format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

// Registerer is where other parts register their own instruments.
func (m *Metrics) Registerer() prometheus.Registerer { return m.reg }

// storeCollector reads the inbox backlog from the store at scrape time.
type storeCollector struct {
	st    *store.Store
	clock func() time.Time
	log   *slog.Logger
}

var (
	pendingDesc = prometheus.NewDesc("klbr_inbox_pending_inputs",
		"Admitted inputs not yet claimed, by session and source kind.", []string{"session", "source_kind"}, nil)
	oldestDesc = prometheus.NewDesc("klbr_inbox_oldest_pending_age_seconds",
		"Age of the oldest pending input (since it was received), by session and source kind.", []string{"session", "source_kind"}, nil)
)

func (c *storeCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- pendingDesc
	ch <- oldestDesc
}

func (c *storeCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	stats, err := c.st.PendingStats(ctx)
	if err != nil {
		c.log.Warn("metrics: read pending inputs", "error", err)
		ch <- prometheus.NewInvalidMetric(pendingDesc, err)
		return
	}
	sessions, err := c.st.Sessions(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(pendingDesc, err)
		return
	}
	// Every known session and source kind has a series, 0 when nothing
	// waits: an idle agent reads 0, not "no data".
	type key struct{ session, kind string }
	byKey := map[key]store.PendingStat{}
	for _, p := range stats {
		byKey[key{p.Session, p.SourceKind}] = p
	}
	now := c.clock()
	for _, s := range sessions {
		for _, k := range SourceKinds {
			p, ok := byKey[key{s.ID, k}]
			age := 0.0
			if ok {
				age = now.Sub(p.Oldest).Seconds()
			}
			ch <- prometheus.MustNewConstMetric(pendingDesc, prometheus.GaugeValue, float64(p.Count), s.ID, k)
			ch <- prometheus.MustNewConstMetric(oldestDesc, prometheus.GaugeValue, age, s.ID, k)
		}
	}
}

// SourceKinds are the source kinds every per-kind series is reported for.
var SourceKinds = []string{string(admission.SourceOperator), string(admission.SourceDiscord)}

// behaviorCollector reports each session's active behavior epoch and
// release, read from the store at scrape time.
type behaviorCollector struct {
	st  *store.Store
	log *slog.Logger
}

var (
	epochDesc = prometheus.NewDesc("klbr_behavior_epoch",
		"The session's active behavior epoch; the release label names its active release.", []string{"session", "release"}, nil)
	releasesDesc = prometheus.NewDesc("klbr_behavior_releases", "Behavior releases recorded.", nil, nil)
	heldDesc     = prometheus.NewDesc("klbr_delivery_reviews_held_total",
		"delivery.review invocations that held a send, by session and whether the host held it as a fallback.", []string{"session", "fallback"}, nil)
	lastGoodDesc = prometheus.NewDesc("klbr_behavior_last_good_epoch",
		"The epoch of each session's last good release (where a rollback goes; the release label names it), 0 with release=\"\" when it has had no other.",
		[]string{"session", "release"}, nil)
)

func (c *behaviorCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- epochDesc
	ch <- sessionStateDesc
	ch <- releasesDesc
	ch <- heldDesc
	ch <- lastGoodDesc
}

func (c *behaviorCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	sessions, err := c.st.Sessions(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(epochDesc, err)
		return
	}
	for _, s := range sessions {
		ch <- prometheus.MustNewConstMetric(epochDesc, prometheus.GaugeValue, float64(s.BehaviorEpoch), s.ID, s.PolicyRevision)
	}
	sessionStates(ch, sessions)
	if ids, err := c.st.ReleaseIDs(ctx); err == nil {
		ch <- prometheus.MustNewConstMetric(releasesDesc, prometheus.GaugeValue, float64(len(ids)))
	}
	held, err := c.st.HeldReviews(ctx)
	if err != nil {
		c.log.Warn("metrics: held reviews", "error", err)
		return
	}
	type key struct {
		session  string
		fallback bool
	}
	counts := map[key]int64{}
	for _, h := range held {
		counts[key{h.Session, h.Fallback}] = h.Count
	}
	for _, s := range sessions {
		for _, fb := range []bool{false, true} {
			ch <- prometheus.MustNewConstMetric(heldDesc, prometheus.CounterValue, float64(counts[key{s.ID, fb}]), s.ID, fmt.Sprint(fb))
		}
	}
	good, err := c.st.LastGoodReleases(ctx)
	if err != nil {
		c.log.Warn("metrics: last good releases", "error", err)
		return
	}
	for _, g := range good {
		ch <- prometheus.MustNewConstMetric(lastGoodDesc, prometheus.GaugeValue, float64(g.Epoch), g.Session, g.Release)
	}
}
