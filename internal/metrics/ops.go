package metrics

import (
	"context"
	"log/slog"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/klbr-dev/klbr/internal/store"
)

var (
	storageBytesDesc = prometheus.NewDesc("klbr_storage_bytes",
		"Bytes of the data directory by part: database (runtime.sqlite), wal (its write-ahead log), artifacts, releases.",
		[]string{"part"}, nil)
	schemaDesc = prometheus.NewDesc("klbr_schema_version",
		"The database's schema version (PRAGMA user_version); readable_by is the oldest klbr-core schema that may still run on it (a binary rollback).",
		[]string{"readable_by"}, nil)
	unansweredDesc = prometheus.NewDesc("klbr_attention_oldest_unanswered_age_seconds",
		"Age of each session's oldest directed attention item (a DM or mention) still pending or only seen; 0 when none waits.",
		[]string{"session"}, nil)
	blockedDesc = prometheus.NewDesc("klbr_session_blocked",
		"1 while a session cannot make progress by itself for the reason: paused or stopped (it waits for klbr-core start), retrying a failed model request, backing_off after rejected requests; 0 otherwise.",
		[]string{"session", "reason"}, nil)
)

// BlockReasons are the reasons klbr_session_blocked reports for every session.
var BlockReasons = []string{"paused", "stopped", "retrying", "backing_off"}

// opsCollector reports what an operator alerts on: storage sizes, the
// schema, unanswered directed items and blocked sessions. Every series is
// present for every known session, 0 when nothing is wrong.
type opsCollector struct {
	st       *store.Store
	clock    func() time.Time
	log      *slog.Logger
	backoffs func() []Backoff
}

func (m *Metrics) backoffList() []Backoff {
	m.backoffsMu.Lock()
	f := m.backoffs
	m.backoffsMu.Unlock()
	if f == nil {
		return nil
	}
	return f()
}

func (c *opsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{storageBytesDesc, schemaDesc, unansweredDesc, blockedDesc} {
		ch <- d
	}
}

func (c *opsCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	sz := c.st.Sizes()
	for _, p := range []struct {
		part string
		n    int64
	}{{"database", sz.Database}, {"wal", sz.WAL}, {"artifacts", sz.Artifacts}, {"releases", sz.Releases}} {
		ch <- prometheus.MustNewConstMetric(storageBytesDesc, prometheus.GaugeValue, float64(p.n), p.part)
	}
	if sc, err := c.st.Schema(ctx); err == nil {
		ch <- prometheus.MustNewConstMetric(schemaDesc, prometheus.GaugeValue, float64(sc.Version), strconv.Itoa(sc.ReadableBy))
	}
	sessions, err := c.st.Sessions(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(blockedDesc, err)
		return
	}
	oldest, err := c.st.OldestUnanswered(ctx)
	if err != nil {
		c.log.Warn("metrics: unanswered items", "error", err)
		ch <- prometheus.NewInvalidMetric(unansweredDesc, err)
	} else {
		now := c.clock()
		for _, s := range sessions {
			age := 0.0
			if at, ok := oldest[s.ID]; ok {
				age = max(0, now.Sub(at).Seconds())
			}
			ch <- prometheus.MustNewConstMetric(unansweredDesc, prometheus.GaugeValue, age, s.ID)
		}
	}
	backoff := map[string]string{}
	for _, b := range c.backoffs() {
		backoff[b.Session] = b.State
	}
	for _, s := range sessions {
		for _, r := range BlockReasons {
			v := 0.0
			if string(s.State) == r || backoff[s.ID] == r {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(blockedDesc, prometheus.GaugeValue, v, s.ID, r)
		}
	}
}
