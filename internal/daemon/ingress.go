package daemon

import (
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/klbr-dev/klbr/internal/artifacts"
	"github.com/klbr-dev/klbr/internal/config"
	"github.com/klbr-dev/klbr/internal/ingress"
)

// newIngress builds the ingress API klbr-discord talks to (DESIGN.md §4):
// admission with source authority only, the outbox hand-over and receipts,
// pending aging ([discord] pending_aging_seconds) and their metrics.
func newIngress(d *daemon, reg prometheus.Registerer, log *slog.Logger) *ingress.Server {
	srv := ingress.New(ingress.Config{Store: d.store, Admit: d.admit, Log: log, Clock: d.clock,
		PendingAging: time.Duration(d.cfg.File.Discord.PendingAgingSeconds) * time.Second,
		// Fetched attachments go to the workbench's artifact store (its
		// spools are bounded by [storage] max_bytes); it is made after the
		// ingress server and before the ingress socket serves.
		Artifacts: func() *artifacts.Store {
			if d.bench == nil {
				return nil
			}
			return d.bench.Config().Artifacts
		},
		AttachmentMaxBytes: d.cfg.File.Discord.AttachmentMaxBytes, Operator: heldOperator(d.cfg.File.Discord)})
	reg.MustRegister(srv.Collector()) // outbox effects, attention items, the gateway
	return srv
}

// heldOperator is who is DMed held sends and may decide them from Discord.
func heldOperator(d config.Discord) string {
	if !d.NotifyHeld {
		return ""
	}
	return d.OperatorUserID
}
