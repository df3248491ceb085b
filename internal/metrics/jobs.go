package metrics

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/klbr-dev/klbr/internal/store"
)

var (
	jobsDesc = prometheus.NewDesc("klbr_jobs",
		"Durable jobs by kind (command, routine, source, child) and state (pending, running, succeeded, failed, cancelled, unknown).",
		[]string{"kind", "state"}, nil)
	jobsNextDesc = prometheus.NewDesc("klbr_jobs_next_deadline_seconds",
		"Unix time of the earliest deadline of a pending job; 0 when none is scheduled.", nil, nil)
	jobsWakeupsDesc = prometheus.NewDesc("klbr_jobs_scheduler_wakeups_total",
		"Times the job scheduler woke (its one timer fired, or a job was added or ended).", nil, nil)
)

// jobKinds and jobStates are always reported, zero when there is none.
var (
	jobKinds  = []string{"command", "routine", "source", "child"}
	jobStates = []store.JobState{store.JobPending, store.JobRunning, store.JobSucceeded, store.JobFailed, store.JobCancelled, store.JobUnknown}
)

// jobsCollector reads job counts and the next deadline at scrape time.
type jobsCollector struct {
	st      *store.Store
	wakeups func() int64
}

// WatchJobs reports jobs by kind and state, the next deadline and, when
// wakeups is set, the scheduler's wake-ups.
func (m *Metrics) WatchJobs(st *store.Store, wakeups func() int64) {
	m.reg.MustRegister(&jobsCollector{st: st, wakeups: wakeups})
}

func (c *jobsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- jobsDesc
	ch <- jobsNextDesc
	ch <- jobsWakeupsDesc
}

func (c *jobsCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	counts := map[string]map[store.JobState]int64{}
	for _, k := range jobKinds {
		counts[k] = map[store.JobState]int64{}
	}
	if cs, err := c.st.JobCounts(ctx); err == nil {
		for _, jc := range cs {
			if counts[jc.Kind] == nil {
				counts[jc.Kind] = map[store.JobState]int64{}
			}
			counts[jc.Kind][jc.State] = jc.Count
		}
	}
	for kind, byState := range counts {
		for _, s := range jobStates {
			ch <- prometheus.MustNewConstMetric(jobsDesc, prometheus.GaugeValue, float64(byState[s]), kind, string(s))
		}
	}
	next := 0.0
	if at, ok, err := c.st.NextDue(ctx); err == nil && ok {
		next = float64(at.UnixMilli()) / 1000
	}
	ch <- prometheus.MustNewConstMetric(jobsNextDesc, prometheus.GaugeValue, next)
	if c.wakeups != nil {
		ch <- prometheus.MustNewConstMetric(jobsWakeupsDesc, prometheus.CounterValue, float64(c.wakeups()))
	}
}
