package daemon

import (
	"log/slog"
	"time"

	"github.com/klbr-dev/klbr/internal/ingress"
)

// newIngress builds the ingress API klbr-discord talks to (DESIGN.md §4):
// admission with source authority only, the outbox hand-over and receipts,
// and pending aging ([discord] pending_aging_seconds).
func newIngress(d *daemon, log *slog.Logger) *ingress.Server {
	return ingress.New(ingress.Config{Store: d.store, Admit: d.admit, Log: log, Clock: d.clock,
		PendingAging: time.Duration(d.cfg.File.Discord.PendingAgingSeconds) * time.Second})
}
