package ingress

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

var (
	effectsDesc = prometheus.NewDesc("klbr_outbox_effects",
		"Discord outbox effects by kind (send, react) and state (pending, attempting, confirmed, failed, unknown, held: waiting for the operator).",
		[]string{"kind", "state"}, nil)
	itemsDesc = prometheus.NewDesc("klbr_attention_items",
		"Discord attention items (DMs and mentions) by status (pending, seen, acted, ignored).", []string{"status"}, nil)
	decisionsDesc = prometheus.NewDesc("klbr_outbox_held_decisions",
		"Held Discord effects the operator decided on, by decision (released, dropped); klbr_outbox_effects{state=\"held\"} counts those still waiting.",
		[]string{"decision"}, nil)
	connectedDesc = prometheus.NewDesc("klbr_discord_gateway_connected",
		"1 while klbr-discord polls for work and reports its gateway connected.", nil, nil)
	gatewayDesc = prometheus.NewDesc("klbr_discord_gateway_events_total",
		"Gateway events of the running klbr-discord, as it reports them: sessions (identifies), resumes, gaps (failed resumes), admitted and dropped messages.",
		[]string{"event"}, nil)
	gapRecoveriesDesc = prometheus.NewDesc("klbr_discord_gap_recoveries_total",
		"Deaf gateway connections klbr-discord found (watched channels moved and the gateway delivered nothing), dropped, resumed and backfilled.", nil, nil)
	invalidRequestsDesc = prometheus.NewDesc("klbr_discord_invalid_requests",
		"Discord REST answers 401, 403 or 429 in the last 10 minutes, as klbr-discord reports them; Discord bans an IP past 10,000, and klbr-discord stops non-essential calls at 5,000 and all at 9,000.", nil, nil)
	threadJoinsDesc = prometheus.NewDesc("klbr_discord_thread_joins_total",
		"New threads and forum posts under watched channels klbr-discord joined.", nil, nil)
	heldWaitDesc = prometheus.NewDesc("klbr_outbox_held_waiting_seconds",
		"How long the oldest held Discord send or reaction has waited for a person (0: none waits). Nothing ends the wait but the operator's decision: "+
			"klbr-core release/drop EFFECT, the browser's Held sends, or the buttons of the operator's Discord DM.", nil, nil)
	rateLimitedDesc = prometheus.NewDesc("klbr_discord_rate_limited_messages_total",
		"Live Discord messages klbr-discord did not admit because a flood passed the per-author or per-channel rate; each burst is recorded by one notice input naming the message ids.", nil, nil)
	rateBurstsDesc = prometheus.NewDesc("klbr_discord_rate_limit_bursts_total",
		"Floods klbr-discord rate-limited, one notice input each.", nil, nil)
)

// Collector reports the outbox and attention items (read from the store at
// scrape time) and the transport's gateway state.
func (s *Server) Collector() prometheus.Collector { return (*collector)(s) }

type collector Server

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- effectsDesc
	ch <- itemsDesc
	ch <- decisionsDesc
	ch <- connectedDesc
	ch <- gatewayDesc
	ch <- gapRecoveriesDesc
	ch <- invalidRequestsDesc
	ch <- threadJoinsDesc
	ch <- rateLimitedDesc
	ch <- heldWaitDesc
	ch <- rateBurstsDesc
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	s := (*Server)(c)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if effects, err := s.cfg.Store.EffectCounts(ctx); err != nil {
		s.cfg.Log.Warn("metrics: outbox", slog.Any("error", err))
		ch <- prometheus.NewInvalidMetric(effectsDesc, err)
	} else {
		// Every kind and state has a series, 0 when none is in it.
		counts := map[[2]string]int64{}
		for _, e := range effects {
			counts[[2]string{e.Kind, e.State}] = e.Count
		}
		for _, k := range []string{"send", "react"} {
			for _, st := range []string{"pending", "attempting", "confirmed", "failed", "unknown", "held"} {
				ch <- prometheus.MustNewConstMetric(effectsDesc, prometheus.GaugeValue, float64(counts[[2]string{k, st}]), k, st)
			}
		}
	}
	if released, dropped, err := s.cfg.Store.HeldDecisions(ctx); err != nil {
		ch <- prometheus.NewInvalidMetric(decisionsDesc, err)
	} else {
		ch <- prometheus.MustNewConstMetric(decisionsDesc, prometheus.GaugeValue, float64(released), "released")
		ch <- prometheus.MustNewConstMetric(decisionsDesc, prometheus.GaugeValue, float64(dropped), "dropped")
	}
	if at, ok, err := s.cfg.Store.HeldOldest(ctx); err != nil {
		ch <- prometheus.NewInvalidMetric(heldWaitDesc, err)
	} else {
		wait := 0.0
		if ok {
			wait = max(0, s.cfg.Clock().Sub(at).Seconds())
		}
		ch <- prometheus.MustNewConstMetric(heldWaitDesc, prometheus.GaugeValue, wait)
	}
	if items, err := s.cfg.Store.AttentionCounts(ctx); err != nil {
		ch <- prometheus.NewInvalidMetric(itemsDesc, err)
	} else {
		counts := map[string]int64{}
		for _, it := range items {
			counts[it.Status] = it.Count
		}
		for _, st := range []string{"pending", "seen", "acted", "ignored"} {
			ch <- prometheus.MustNewConstMetric(itemsDesc, prometheus.GaugeValue, float64(counts[st]), st)
		}
	}
	s.mu.Lock()
	g, live := s.gateway, s.connectedLocked() || (!s.polled.IsZero() && s.cfg.Clock().Sub(s.polled) < 30*time.Second)
	s.mu.Unlock()
	connected := 0.0
	if live && g.Connected {
		connected = 1
	}
	ch <- prometheus.MustNewConstMetric(connectedDesc, prometheus.GaugeValue, connected)
	for _, e := range []struct {
		name string
		n    uint64
	}{{"sessions", g.Sessions}, {"resumes", g.Resumes}, {"gaps", g.Gaps}, {"admitted", g.Admitted}, {"dropped", g.Dropped}} {
		ch <- prometheus.MustNewConstMetric(gatewayDesc, prometheus.CounterValue, float64(e.n), e.name)
	}
	ch <- prometheus.MustNewConstMetric(gapRecoveriesDesc, prometheus.CounterValue, float64(g.GapRecoveries))
	ch <- prometheus.MustNewConstMetric(invalidRequestsDesc, prometheus.GaugeValue, float64(g.InvalidRequests))
	ch <- prometheus.MustNewConstMetric(threadJoinsDesc, prometheus.CounterValue, float64(g.ThreadJoins))
	ch <- prometheus.MustNewConstMetric(rateLimitedDesc, prometheus.CounterValue, float64(g.RateLimited))
	ch <- prometheus.MustNewConstMetric(rateBurstsDesc, prometheus.CounterValue, float64(g.RateLimitBursts))
}
