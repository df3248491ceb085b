package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/klbr-dev/klbr/internal/diskuse"
)

// WatchStorageBound reports the data directory against [storage] max_bytes:
// what klbr-core counts as used, the bound (0: unbounded) and the headroom.
func (m *Metrics) WatchStorageBound(usage func() diskuse.Usage) {
	m.reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "klbr_storage_max_bytes",
			Help: "[storage] max_bytes: the bound on the data directory (database, WAL, artifacts, releases); 0 when unbounded.",
		}, func() float64 { return float64(usage().Max) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "klbr_storage_used_bytes",
			Help: "Bytes of the data directory counted against max_bytes: the last measurement, artifacts stored since, and open spools.",
		}, func() float64 { return float64(usage().Used) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "klbr_storage_headroom_bytes",
			Help: "max_bytes minus the used bytes (0 at the bound: new artifacts are refused; also 0 when unbounded).",
		}, func() float64 { return float64(usage().Headroom) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "klbr_storage_warn_ratio",
			Help: "[storage] warn_at: past this fraction of max_bytes klbr-core runs gc by itself.",
		}, func() float64 { return usage().WarnAt }),
	)
}
