package metrics

import "github.com/prometheus/client_golang/prometheus"

// ContextSample is one session's context accounting (the turn loop's).
type ContextSample struct {
	Session     string
	Tokens      int // the last request's estimate, reserve and margin included
	Budget      int
	Threshold   int
	Compactions int64
	Degraded    int64
}

var (
	contextTokensDesc = prometheus.NewDesc("klbr_context_tokens",
		"Estimated tokens of each session's last request: prompt (calibrated against reported usage), reserved output and safety margin.",
		[]string{"session"}, nil)
	contextBudgetDesc = prometheus.NewDesc("klbr_context_budget_tokens",
		"Each session's context budget (agent.context_budget_tokens).", []string{"session"}, nil)
	contextThresholdDesc = prometheus.NewDesc("klbr_context_compact_threshold_tokens",
		"The estimate past which a session's context is compacted (agent.compact_at of the budget).", []string{"session"}, nil)
	compactionsDesc = prometheus.NewDesc("klbr_context_compactions_total",
		"Compactions committed since klbr-core started, by session and kind (normal summaries, degraded stubs).",
		[]string{"session", "kind"}, nil)
)

type contextCollector struct{ samples func() []ContextSample }

func (c contextCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{contextTokensDesc, contextBudgetDesc, contextThresholdDesc, compactionsDesc} {
		ch <- d
	}
}

func (c contextCollector) Collect(ch chan<- prometheus.Metric) {
	for _, s := range c.samples() {
		ch <- prometheus.MustNewConstMetric(contextTokensDesc, prometheus.GaugeValue, float64(s.Tokens), s.Session)
		ch <- prometheus.MustNewConstMetric(contextBudgetDesc, prometheus.GaugeValue, float64(s.Budget), s.Session)
		ch <- prometheus.MustNewConstMetric(contextThresholdDesc, prometheus.GaugeValue, float64(s.Threshold), s.Session)
		ch <- prometheus.MustNewConstMetric(compactionsDesc, prometheus.CounterValue, float64(s.Compactions-s.Degraded), s.Session, "normal")
		ch <- prometheus.MustNewConstMetric(compactionsDesc, prometheus.CounterValue, float64(s.Degraded), s.Session, "degraded")
	}
}

// WatchContext exposes the sessions' context accounting, read at scrape time.
func (m *Metrics) WatchContext(samples func() []ContextSample) {
	m.reg.MustRegister(contextCollector{samples: samples})
}
