package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Backoff is one session's retry or backoff, as the turn loop reports it.
type Backoff struct {
	Session string
	State   string // retrying, backing_off
	NextAt  time.Time
	InARow  int
}

var (
	backoffNextDesc = prometheus.NewDesc("klbr_session_backoff_next_timestamp_seconds",
		"When a session that is retrying a failed model request (state=retrying) or backing off after a rejected request or a loop guard (state=backing_off) tries next, as a Unix time.",
		[]string{"session", "state"}, nil)
	backoffCountDesc = prometheus.NewDesc("klbr_session_backoff_failures",
		"Failures (or ended attempts) in a row of a session's current backoff.", []string{"session", "state"}, nil)
	agentDesc = prometheus.NewDesc("klbr_agent_running",
		"1 when the agent's turn loop runs; 0 when it is disabled (the reason is in klbr-core status and the log).", nil, nil)
)

// backoffCollector reports the turn loop's backoffs at scrape time.
type backoffCollector struct {
	running func() bool
	list    func() []Backoff
}

func (c *backoffCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- backoffNextDesc
	ch <- backoffCountDesc
	ch <- agentDesc
}

func (c *backoffCollector) Collect(ch chan<- prometheus.Metric) {
	up := 0.0
	if c.running() {
		up = 1
	}
	ch <- prometheus.MustNewConstMetric(agentDesc, prometheus.GaugeValue, up)
	for _, b := range c.list() {
		ch <- prometheus.MustNewConstMetric(backoffNextDesc, prometheus.GaugeValue, float64(b.NextAt.UnixMilli())/1000, b.Session, b.State)
		ch <- prometheus.MustNewConstMetric(backoffCountDesc, prometheus.GaugeValue, float64(b.InARow), b.Session, b.State)
	}
}

// WatchAgent exposes whether the agent runs and its sessions' backoffs;
// running and list are called at scrape time.
func (m *Metrics) WatchAgent(running func() bool, list func() []Backoff) {
	m.backoffsMu.Lock()
	m.backoffs = list
	m.backoffsMu.Unlock()
	m.reg.MustRegister(&backoffCollector{running: running, list: list})
}

var storageDesc = prometheus.NewDesc("klbr_storage_fault",
	"1 while writes fail (a full disk, an I/O error, a read-only file system): new work waits and klbr-core probes until writes succeed again.", nil, nil)

type storageCollector struct{ fault func() bool }

func (c storageCollector) Describe(ch chan<- *prometheus.Desc) { ch <- storageDesc }

func (c storageCollector) Collect(ch chan<- prometheus.Metric) {
	v := 0.0
	if c.fault() {
		v = 1
	}
	ch <- prometheus.MustNewConstMetric(storageDesc, prometheus.GaugeValue, v)
}

// WatchStorage exposes whether a storage fault is in force.
func (m *Metrics) WatchStorage(fault func() bool) {
	m.reg.MustRegister(storageCollector{fault: fault})
}
