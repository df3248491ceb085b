package store

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// statusReads is what one `klbr-core status` (and one session read, which is
// a status) asks of the store, plus the turn loop's Glance: the same calls in
// the same order as the daemon's Status.
func statusReads(ctx context.Context, s *Store) error {
	sessions, err := s.Sessions(ctx)
	if err != nil {
		return err
	}
	if _, err := s.PendingStats(ctx); err != nil {
		return err
	}
	if _, err := s.Schema(ctx); err != nil {
		return err
	}
	for _, se := range sessions {
		if _, err := s.Turn(ctx, se.ID); err != nil {
			return err
		}
		if _, err := s.ContextStats(ctx, se.ID); err != nil {
			return err
		}
		if _, err := s.Glance(ctx, se.ID); err != nil {
			return err
		}
	}
	_, err = s.ObserverStats(ctx)
	return err
}

// fillPending admits n inputs to session "default" (a quarter operator, the
// rest Discord), none consumed, in transactions of 10,000.
func fillPending(tb testing.TB, s *Store, n int) {
	tb.Helper()
	at := time.Now().Add(-time.Hour)
	for done := 0; done < n; {
		err := s.Write(context.Background(), func(tx *Tx) error {
			for end := min(n, done+10_000); done < end; done++ {
				kind := "discord"
				if done%4 == 0 {
					kind = "operator"
				}
				if _, err := tx.AdmitInput(NewInput{Session: "default", SourceKind: kind, SourceKey: fmt.Sprintf("k%d", done),
					Conversation: "discord:1", Author: "a", Directed: true, OccurredAt: at, ReceivedAt: at.Add(time.Duration(done) * time.Millisecond),
					Body: "hello"}); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			tb.Fatal(err)
		}
	}
}

// BenchmarkStatus: status latency at 0 and 400,000 pending inputs, side by
// side (issue 27: the same). Run with
//
//	go test -run '^$' -bench BenchmarkStatus -benchtime 200x ./internal/store/
func BenchmarkStatus(b *testing.B) {
	for _, n := range []int{0, 400_000} {
		s, err := Open(context.Background(), b.TempDir(), Options{})
		if err != nil {
			b.Fatal(err)
		}
		if err := s.Write(context.Background(), func(tx *Tx) error { _, err := tx.EnsureSession("default"); return err }); err != nil {
			b.Fatal(err)
		}
		fillPending(b, s, n)
		// The history index catches up now, not in the background while it is measured.
		if err := s.syncIndex(context.Background()); err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("pending=%d", n), func(b *testing.B) {
			for b.Loop() {
				if err := statusReads(b.Context(), s); err != nil {
					b.Fatal(err)
				}
			}
		})
		s.Close()
	}
}
