package store

import (
	"testing"
	"time"
)

// BenchmarkStepLedgerRow: a step's commit (which carries its ledger row)
// beside the same commit with one more ledger row in its transaction: the
// difference is what a ledger row adds to a step's commit.
func BenchmarkStepLedgerRow(b *testing.B) {
	for _, extra := range []bool{false, true} {
		name := "step"
		if extra {
			name = "step+1_more_ledger_row"
		}
		b.Run(name, func(b *testing.B) {
			s := openTest(&testing.T{}, b.TempDir(), Options{})
			var attempt int64
			if err := s.Write(b.Context(), func(tx *Tx) (err error) {
				if _, err := tx.EnsureSession("default"); err != nil {
					return err
				}
				attempt, _, err = tx.StartAttempt(NewAttempt{Session: "default", WakeReason: "input"})
				return err
			}); err != nil {
				b.Fatal(err)
			}
			p, c := 1000, 100
			i := 0
			for b.Loop() {
				i++
				err := s.Write(b.Context(), func(tx *Tx) error {
					if _, err := tx.RecordStep(StepResult{Session: "default", Attempt: attempt, Ordinal: i, Started: time.Now(), Route: "r",
						State: "completed", Usage: StepUsage{Prompt: &p, Completion: &c}, CostUSD: costp(0.001), CostSource: CostPrice}); err != nil {
						return err
					}
					if extra {
						return tx.RecordSpend(SpendEntry{Session: "default", Route: "r", Purpose: "turn", Prompt: p, Completion: c, CostUSD: costp(0.001), CostSource: CostPrice}, 0)
					}
					return nil
				})
				if err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
