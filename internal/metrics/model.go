package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/klbr-dev/klbr/internal/live"
	"github.com/klbr-dev/klbr/internal/provider"
	"github.com/klbr-dev/klbr/internal/store"
)

// model holds the turn loop's model instruments.
type model struct {
	requests  *prometheus.CounterVec
	tokens    *prometheus.CounterVec
	summaries *prometheus.CounterVec
}

func newModel(reg prometheus.Registerer) *model {
	m := &model{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "klbr_model_requests_total",
			Help: "Model requests of the turn loop by route and outcome (ok, cancelled, error_<kind>).",
		}, []string{"route", "outcome"}),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "klbr_model_tokens_total",
			Help: "Tokens as the provider reported them, by route and kind (prompt, completion, cache_read, cache_write, cache_miss). A kind the provider does not report is never added to.",
		}, []string{"route", "kind"}),
	}
	m.summaries = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "klbr_summarizer_requests_total",
		Help: "Tool-free summary requests of compaction by route and outcome (ok, error, timeout, empty, truncated, invalid).",
	}, []string{"route", "outcome"})
	reg.MustRegister(m.requests, m.tokens, m.summaries)
	return m
}

// PrepareSummary makes route's summary series visible before its first request.
func (m *Metrics) PrepareSummary(route string) {
	m.model.summaries.WithLabelValues(route, "ok")
}

// ObserveSummary counts one summarizer request.
func (m *Metrics) ObserveSummary(route, outcome string) {
	m.model.summaries.WithLabelValues(route, outcome).Inc()
}

// ObserveModel counts one model request and the usage its provider reported.
func (m *Metrics) ObserveModel(route, outcome string, u provider.Usage) {
	m.model.requests.WithLabelValues(route, outcome).Inc()
	for kind, n := range map[string]*int{"prompt": u.PromptTokens, "completion": u.CompletionTokens,
		"cache_read": u.CacheReadTokens, "cache_write": u.CacheWriteTokens, "cache_miss": u.CacheMissTokens} {
		if n != nil {
			m.model.tokens.WithLabelValues(route, kind).Add(float64(*n))
		}
	}
}

// PrepareRoute makes route's request series visible before its first request.
func (m *Metrics) PrepareRoute(route string) {
	m.model.requests.WithLabelValues(route, "ok")
	for _, kind := range []string{"prompt", "completion"} {
		m.model.tokens.WithLabelValues(route, kind)
	}
}

var sessionStateDesc = prometheus.NewDesc("klbr_session_state",
	"1 for each session's current state (ready, running, waiting, paused, stopped).", []string{"session", "state"}, nil)

// sessionStates reports each session's state as one series per state.
func sessionStates(ch chan<- prometheus.Metric, sessions []store.Session) {
	for _, s := range sessions {
		for _, st := range []store.SessionState{store.StateReady, store.StateRunning, store.StateWaiting, store.StatePaused, store.StateStopped} {
			v := 0.0
			if s.State == st {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(sessionStateDesc, prometheus.GaugeValue, v, s.ID, string(st))
		}
	}
}

// WatchDeltas exposes how many token deltas slow subscribers lost.
func (m *Metrics) WatchDeltas(h *live.Hub) {
	m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "klbr_live_deltas_dropped_total",
		Help: "Token deltas dropped because a live subscriber (a browser socket) was behind; the durable records are unaffected.",
	}, func() float64 { return float64(h.Dropped()) }))
}

// routeRestDesc describes klbr_model_route_resting_seconds.
var routeRestDesc = prometheus.NewDesc("klbr_model_route_resting_seconds",
	"Seconds a model route still rests after a transient failure (its steps go to the next route of the plan meanwhile); 0 when it is in use.",
	[]string{"route"}, nil)

// routeRest reports the Router's resting routes at scrape time.
type routeRest struct{ r *provider.Router }

func (c routeRest) Describe(ch chan<- *prometheus.Desc) { ch <- routeRestDesc }
func (c routeRest) Collect(ch chan<- prometheus.Metric) {
	for route, s := range c.r.Resting() {
		ch <- prometheus.MustNewConstMetric(routeRestDesc, prometheus.GaugeValue, s, route)
	}
}

// WatchRouter exposes which routes rest, for every route the Router has.
func (m *Metrics) WatchRouter(r *provider.Router) {
	m.reg.MustRegister(routeRest{r})
}
