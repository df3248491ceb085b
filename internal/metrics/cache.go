package metrics

import "github.com/prometheus/client_golang/prometheus"

var promptCacheDesc = prometheus.NewDesc("klbr_prompt_cache_hit_ratio",
	"Share of today's prompt tokens (in [spend] time_zone) the provider reported as read from its prompt cache, by route, from the spend ledger. Absent for a route with no prompt tokens today.",
	[]string{"route"}, nil)

type promptCacheCollector struct{ ratios func() map[string]float64 }

func (c promptCacheCollector) Describe(ch chan<- *prometheus.Desc) { ch <- promptCacheDesc }

func (c promptCacheCollector) Collect(ch chan<- prometheus.Metric) {
	for route, r := range c.ratios() {
		ch <- prometheus.MustNewConstMetric(promptCacheDesc, prometheus.GaugeValue, r, route)
	}
}

// WatchPromptCache exposes klbr_prompt_cache_hit_ratio{route}; ratios is
// read at scrape time (from the ledger).
func (m *Metrics) WatchPromptCache(ratios func() map[string]float64) {
	m.reg.MustRegister(promptCacheCollector{ratios: ratios})
}
