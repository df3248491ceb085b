package metrics

import "github.com/prometheus/client_golang/prometheus"

// ModelSlots is what the model-request slots ([agents] model_slots) are
// doing, as the turn loop reports it.
type ModelSlots struct {
	Size                          int
	Roots, Children               int // in use
	WaitingRoots, WaitingChildren int
	ChildrenWaited                int64 // child requests that had to wait, since start
}

var (
	slotsSizeDesc = prometheus.NewDesc("klbr_model_slots",
		"Model requests that may be in flight at once ([agents] model_slots); child agents hold at most one less.", nil, nil)
	slotsUsedDesc = prometheus.NewDesc("klbr_model_slots_in_use",
		"Model-request slots in use now, by holder (root: a session without a parent; child: a child agent).", []string{"holder"}, nil)
	slotsWaitDesc = prometheus.NewDesc("klbr_model_slots_waiting",
		"Model requests waiting for a slot now, by holder; a child waits while its siblings hold all the slots children may take.", []string{"holder"}, nil)
	slotsWaitedDesc = prometheus.NewDesc("klbr_model_slot_waits_total",
		"Child agents' model requests that had to wait for a slot, since start.", nil, nil)
)

type slotsCollector struct{ stats func() ModelSlots }

func (c slotsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- slotsSizeDesc
	ch <- slotsUsedDesc
	ch <- slotsWaitDesc
	ch <- slotsWaitedDesc
}

func (c slotsCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.stats()
	ch <- prometheus.MustNewConstMetric(slotsSizeDesc, prometheus.GaugeValue, float64(s.Size))
	ch <- prometheus.MustNewConstMetric(slotsUsedDesc, prometheus.GaugeValue, float64(s.Roots), "root")
	ch <- prometheus.MustNewConstMetric(slotsUsedDesc, prometheus.GaugeValue, float64(s.Children), "child")
	ch <- prometheus.MustNewConstMetric(slotsWaitDesc, prometheus.GaugeValue, float64(s.WaitingRoots), "root")
	ch <- prometheus.MustNewConstMetric(slotsWaitDesc, prometheus.GaugeValue, float64(s.WaitingChildren), "child")
	ch <- prometheus.MustNewConstMetric(slotsWaitedDesc, prometheus.CounterValue, float64(s.ChildrenWaited))
}

// WatchModelSlots exposes the model-request slots; stats is called at scrape time.
func (m *Metrics) WatchModelSlots(stats func() ModelSlots) {
	m.reg.MustRegister(slotsCollector{stats: stats})
}
