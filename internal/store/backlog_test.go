package store

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// recount is the backlog by a scan of the inputs: what inbox_backlog and
// inbox_pending_oldest must always agree with.
func recount(t *testing.T, s *Store) []PendingStat {
	t.Helper()
	rows, err := s.rdb.Query(`SELECT b.session_id, i.source_kind, count(*), min(i.received_at)
		FROM inbox b JOIN inputs i ON i.id = b.input_id WHERE b.state = 'pending'
		GROUP BY b.session_id, i.source_kind ORDER BY 1, 2`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []PendingStat
	for rows.Next() {
		var p PendingStat
		var oldest int64
		if err := rows.Scan(&p.Session, &p.SourceKind, &p.Count, &oldest); err != nil {
			t.Fatal(err)
		}
		p.Oldest = time.UnixMilli(oldest)
		out = append(out, p)
	}
	return out
}

// TestBacklogCountFollowsEveryInboxMove: after random admissions, claims,
// releases, recoveries, frames and cancels in two sessions, PendingStats and
// Glance (O(1) in the backlog) say what a scan of the inputs says.
func TestBacklogCountFollowsEveryInboxMove(t *testing.T) {
	s := newStore(t)
	mustWrite(t, s, func(tx *Tx) error { _, err := tx.EnsureSession("other"); return err })
	rng := rand.New(rand.NewPCG(1, 27))
	sessions := []string{"default", "other"}
	at := time.Now().Add(-time.Hour)
	n := 0
	for round := range 60 {
		mustWrite(t, s, func(tx *Tx) error {
			sess := sessions[rng.IntN(2)]
			switch op := rng.IntN(7); op {
			case 0, 1, 2: // admit a few
				for range 1 + rng.IntN(5) {
					n++
					kind := []string{"operator", "discord"}[rng.IntN(2)]
					if _, err := tx.AdmitInput(NewInput{Session: sess, SourceKind: kind, SourceKey: fmt.Sprintf("k%d", n),
						Conversation: "c", Author: "a", OccurredAt: at, ReceivedAt: at.Add(time.Duration(rng.IntN(100000)) * time.Millisecond),
						Body: "x"}); err != nil {
						return err
					}
				}
			case 3: // claim, then consume some and release the rest
				items, err := tx.ClaimPending(sess, 1+rng.IntN(4))
				if err != nil || len(items) == 0 {
					return err
				}
				var ids []int64
				for _, it := range items {
					ids = append(ids, it.InputID)
				}
				k := rng.IntN(len(ids) + 1)
				if k > 0 {
					if _, err := tx.CommitFrame(Frame{Session: sess, InputIDs: ids[:k]}); err != nil {
						return err
					}
				}
				return tx.ReleaseClaims(ids[k:])
			case 4: // claim and leave claimed, to be recovered
				_, err := tx.ClaimPending(sess, 1+rng.IntN(3))
				return err
			case 5:
				_, err := tx.RecoverClaims()
				return err
			case 6: // cancel the newest pending or claimed input
				var id int64
				if err := tx.queryRow(`SELECT max(input_id) FROM inbox WHERE session_id = ? AND state IN ('pending', 'claimed')`, sess).Scan(&id); err != nil || id == 0 {
					return nil
				}
				return tx.CancelInput(id)
			}
			return nil
		})
		got, err := s.PendingStats(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if want := recount(t, s); !slices.Equal(got, want) {
			t.Fatalf("round %d: PendingStats %v, a recount says %v", round, got, want)
		}
		for _, sess := range sessions {
			g, err := s.Glance(context.Background(), sess)
			if err != nil {
				t.Fatal(err)
			}
			var op, other int64
			for _, p := range got {
				if p.Session == sess && p.SourceKind == "operator" {
					op += p.Count
				} else if p.Session == sess {
					other += p.Count
				}
			}
			if g.PendingOperator != op || g.PendingOther != other {
				t.Fatalf("round %d: %s glances %d operator and %d other pending, the stats say %d and %d", round, sess, g.PendingOperator, g.PendingOther, op, other)
			}
		}
	}
}
