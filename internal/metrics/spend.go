package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
)

// SpendState is what the spend meter reports at scrape time.
type SpendState struct {
	DayUSD, MonthUSD float64
	DayTokens        int64
	Warned           []string // caps past warn_at this period
	Held             int      // sessions waiting at a cap
}

var (
	spendPeriodDesc = prometheus.NewDesc("klbr_spend_period_usd",
		"USD spent in the current period (period=day or month, in [spend] time_zone), by the ledger.", []string{"period"}, nil)
	spendDayTokensDesc = prometheus.NewDesc("klbr_spend_day_tokens",
		"Prompt+completion tokens of today's model requests (what [spend] daily_tokens bounds).", nil, nil)
	spendWarnDesc = prometheus.NewDesc("klbr_spend_warning",
		"1 while a cap's spend is past [spend] warn_at in the current period.", []string{"cap"}, nil)
	spendHeldDesc = prometheus.NewDesc("klbr_spend_held_sessions",
		"Sessions whose next model request waits at a spend cap (klbr-core status: \"spend cap: <which>, resets <when>\").", nil, nil)
)

type spendCollector struct{ state func() SpendState }

func (c spendCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- spendPeriodDesc
	ch <- spendDayTokensDesc
	ch <- spendWarnDesc
	ch <- spendHeldDesc
}

func (c spendCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.state()
	ch <- prometheus.MustNewConstMetric(spendPeriodDesc, prometheus.GaugeValue, s.DayUSD, "day")
	ch <- prometheus.MustNewConstMetric(spendPeriodDesc, prometheus.GaugeValue, s.MonthUSD, "month")
	ch <- prometheus.MustNewConstMetric(spendDayTokensDesc, prometheus.GaugeValue, float64(s.DayTokens))
	for _, cap := range []string{"daily_usd", "monthly_usd", "daily_tokens"} {
		v := 0.0
		for _, w := range s.Warned {
			if w == cap {
				v = 1
			}
		}
		ch <- prometheus.MustNewConstMetric(spendWarnDesc, prometheus.GaugeValue, v, cap)
	}
	ch <- prometheus.MustNewConstMetric(spendHeldDesc, prometheus.GaugeValue, float64(s.Held))
}

// WatchSpend exposes the spend meter (state is called at scrape time) and
// returns the function that counts each settled request's cost:
// klbr_spend_usd_total{route,purpose}, klbr_spend_tokens_total{route,purpose},
// at 0 for each of routes and purpose (turn, summary) before any request.
func (m *Metrics) WatchSpend(state func() SpendState, routes []string) func(route, purpose string, usd float64, tokens int) {
	usd := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "klbr_spend_usd_total",
		Help: "USD of model requests by route and purpose (turn, summary), the provider's reported cost else the route's price; unpriced routes add 0."},
		[]string{"route", "purpose"})
	tok := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "klbr_spend_tokens_total",
		Help: "Prompt+completion tokens of model requests by route and purpose."}, []string{"route", "purpose"})
	m.reg.MustRegister(usd, tok, spendCollector{state: state})
	for _, r := range routes {
		for _, p := range []string{"turn", "summary"} {
			usd.WithLabelValues(r, p)
			tok.WithLabelValues(r, p)
		}
	}
	return func(route, purpose string, u float64, tokens int) {
		usd.WithLabelValues(route, purpose).Add(u)
		tok.WithLabelValues(route, purpose).Add(float64(tokens))
	}
}
