package metrics

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

var (
	hostUpDesc = prometheus.NewDesc("klbr_host_up",
		"1 when klbr-core's last connect or command to the worker host got through, 0 when it failed or none was tried yet.",
		[]string{"host"}, nil)
	hostUnitsDesc = prometheus.NewDesc("klbr_host_units",
		"klbr units klbr-core runs on the worker host now, by kind (job: a job attempt's klbr-job-*.service; child: a running child agent working there, its klbr-workbench-child-*.service while its kernel lives).",
		[]string{"host", "kind"}, nil)
	hostWaitingDesc = prometheus.NewDesc("klbr_host_jobs_waiting",
		"Pending jobs that may run only on this worker host (by its name or a label it has): work that waits while it is down.",
		[]string{"host"}, nil)
)

// HostKinds are the kinds of klbr_host_units, each reported (0 when none).
var HostKinds = []string{"job", "child"}

// HostState is one worker host as /metrics reports it.
type HostState struct {
	Name    string
	Up      bool
	Units   map[string]int // by kind
	Waiting int
}

// WatchHosts reports each worker host that read returns, read at scrape
// time (bounded by 5 s).
func (m *Metrics) WatchHosts(read func(ctx context.Context) []HostState) {
	m.reg.MustRegister(&hostsCollector{read: read})
}

type hostsCollector struct {
	read func(ctx context.Context) []HostState
}

func (c *hostsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- hostUpDesc
	ch <- hostUnitsDesc
	ch <- hostWaitingDesc
}

func (c *hostsCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, h := range c.read(ctx) {
		up := 0.0
		if h.Up {
			up = 1
		}
		ch <- prometheus.MustNewConstMetric(hostUpDesc, prometheus.GaugeValue, up, h.Name)
		for _, k := range HostKinds {
			ch <- prometheus.MustNewConstMetric(hostUnitsDesc, prometheus.GaugeValue, float64(h.Units[k]), h.Name, k)
		}
		ch <- prometheus.MustNewConstMetric(hostWaitingDesc, prometheus.GaugeValue, float64(h.Waiting), h.Name)
	}
}
