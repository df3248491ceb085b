package daemon

import (
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/klbr-dev/klbr/internal/ingress"
)

// newIngress builds the ingress API klbr-discord talks to (DESIGN.md §4):
// admission with source authority only, the outbox hand-over and receipts,
// pending aging ([discord] pending_aging_seconds) and their metrics.
func newIngress(d *daemon, reg prometheus.Registerer, log *slog.Logger) *ingress.Server {
	srv := ingress.New(ingress.Config{Store: d.store, Admit: d.admit, Log: log, Clock: d.clock,
		PendingAging: time.Duration(d.cfg.File.Discord.PendingAgingSeconds) * time.Second})
	reg.MustRegister(srv.Collector()) // outbox effects, attention items, the gateway
	return srv
}
