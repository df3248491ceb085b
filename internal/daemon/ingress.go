package daemon

import (
	"log/slog"

	"github.com/klbr-dev/klbr/internal/ingress"
)

// newIngress builds the ingress API klbr-discord talks to (DESIGN.md §4):
// admission with source authority only, the outbox hand-over and receipts.
func newIngress(d *daemon, log *slog.Logger) *ingress.Server {
	return ingress.New(ingress.Config{Store: d.store, Admit: d.admit, Log: log, Clock: d.clock})
}
