package store

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func admitN(t *testing.T, s *Store, session string, keys ...string) []int64 {
	t.Helper()
	var ids []int64
	mustWrite(t, s, func(tx *Tx) error {
		ids = ids[:0] // a write function may run twice
		for _, k := range keys {
			a, err := tx.AdmitInput(testInput(session, k, "body "+k))
			if err != nil {
				return err
			}
			ids = append(ids, a.InputID)
		}
		return nil
	})
	return ids
}

func TestFrameAcknowledgesItsInputs(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	ids := admitN(t, s, "default", "a", "b", "c")

	var claimed []InboxItem
	mustWrite(t, s, func(tx *Tx) (err error) { claimed, err = tx.ClaimPending("default", 2); return err })
	if len(claimed) != 2 || claimed[0].InputID != ids[0] || claimed[1].InputID != ids[1] {
		t.Fatalf("claimed %+v, want the two oldest", claimed)
	}
	// Claiming is not acknowledging: without a frame nothing is consumed.
	err := s.Write(ctx, func(tx *Tx) error {
		_, err := tx.exec("UPDATE inbox SET state = 'consumed' WHERE input_id = ?", ids[0])
		return err
	})
	if err == nil {
		t.Fatal("an input became consumed without a frame")
	}

	var frame int64
	mustWrite(t, s, func(tx *Tx) (err error) {
		frame, err = tx.CommitFrame(Frame{Session: "default", InputIDs: []int64{ids[0], ids[1]}, ContextEpoch: 3,
			PolicyRevision: "rev1", RoutingHandles: json.RawMessage(`{"operator":"operator"}`)})
		return err
	})
	items, _ := s.Inbox(ctx, "default")
	want := []InboxState{InboxConsumed, InboxConsumed, InboxPending}
	for i, it := range items {
		if it.State != want[i] {
			t.Errorf("input %d: %s, want %s", it.InputID, it.State, want[i])
		}
		if it.State == InboxConsumed && it.FrameID != frame {
			t.Errorf("input %d consumed by frame %d, want %d", it.InputID, it.FrameID, frame)
		}
	}
	var epoch int64
	var rev, routing string
	s.rdb.QueryRow("SELECT context_epoch, policy_revision, routing_handles FROM attention_frames WHERE id = ?", frame).Scan(&epoch, &rev, &routing)
	if epoch != 3 || rev != "rev1" || routing != `{"operator":"operator"}` {
		t.Errorf("frame = %d %q %q", epoch, rev, routing)
	}
	if err := s.Write(ctx, func(tx *Tx) error { _, err := tx.exec("UPDATE attention_frames SET policy_revision = 'x'"); return err }); err == nil {
		t.Error("a frame was modified")
	}
}

func TestInboxRefusesIllegalMoves(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	mustWrite(t, s, func(tx *Tx) error { _, err := tx.EnsureSession("other"); return err })
	ids := admitN(t, s, "default", "a", "b")
	other := admitN(t, s, "other", "z")

	for _, tc := range []struct {
		name string
		fn   func(*Tx) error
	}{
		{"frame over a pending input", func(tx *Tx) error {
			_, err := tx.CommitFrame(Frame{Session: "default", InputIDs: []int64{ids[0]}})
			return err
		}},
		{"frame over another session's input", func(tx *Tx) error {
			if _, err := tx.ClaimPending("other", 1); err != nil {
				return err
			}
			_, err := tx.CommitFrame(Frame{Session: "default", InputIDs: []int64{other[0]}})
			return err
		}},
		{"frame over nothing", func(tx *Tx) error { _, err := tx.CommitFrame(Frame{Session: "default"}); return err }},
		{"release a pending input", func(tx *Tx) error { return tx.ReleaseClaims([]int64{ids[1]}) }},
		{"pending straight to consumed", func(tx *Tx) error { return tx.moveInbox(ids[1], InboxPending, InboxConsumed, 1) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before, _ := s.Inbox(ctx, "default")
			if err := s.Write(ctx, tc.fn); err == nil {
				t.Fatal("accepted")
			}
			after, _ := s.Inbox(ctx, "default")
			for i := range before {
				if before[i] != after[i] {
					t.Fatalf("a refused move changed the inbox: %+v → %+v", before[i], after[i])
				}
			}
		})
	}

	// cancelled is final.
	mustWrite(t, s, func(tx *Tx) error { return tx.CancelInput(ids[1]) })
	err := s.Write(ctx, func(tx *Tx) error { return tx.moveInbox(ids[1], InboxCancelled, InboxPending, nil) })
	if !errors.Is(err, ErrInboxState) {
		t.Fatalf("cancelled → pending: %v", err)
	}
}

func TestRecoverClaimsReturnsWorkOfADeadRun(t *testing.T) {
	s := newStore(t)
	admitN(t, s, "default", "a", "b")
	mustWrite(t, s, func(tx *Tx) error { _, err := tx.ClaimPending("default", 10); return err })
	var n int64
	mustWrite(t, s, func(tx *Tx) (err error) { n, err = tx.RecoverClaims(); return err })
	if n != 2 {
		t.Fatalf("recovered %d, want 2", n)
	}
	stats, _ := s.PendingStats(context.Background())
	if len(stats) != 1 || stats[0].Count != 2 {
		t.Fatalf("pending after recovery: %+v", stats)
	}
}

func TestRecordsPageAndWatch(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	wake, cancel := s.Watch("default")
	defer cancel()
	admitN(t, s, "default", "a", "b", "c")
	select {
	case <-wake:
	default:
		t.Fatal("no wake-up after an acknowledged write")
	}
	recs, err := s.Records(ctx, "default", 0, 2)
	if err != nil || len(recs) != 2 {
		t.Fatalf("page: %d %v", len(recs), err)
	}
	rest, _ := s.Records(ctx, "default", recs[1].Seq, 10)
	if len(rest) != 1 || rest[0].Seq <= recs[1].Seq {
		t.Fatalf("after cursor %d: %+v", recs[1].Seq, rest)
	}
	var content struct{ Text string }
	json.Unmarshal(rest[0].Content, &content)
	if content.Text != "body c" || rest[0].Lane != LaneInput || !strings.HasSuffix(rest[0].Kind, ".input") {
		t.Fatalf("record: %+v", rest[0])
	}
}
