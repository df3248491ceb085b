package store

import (
	"context"
	"errors"
	"testing"
)

// Each held effect is handed out for a notice until one outcome is
// recorded, then never again; the first outcome stands; a decided effect
// is not handed out; bad outcomes are refused.
func TestHeldNoticesAreSentOncePerEffect(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	_, dm := admitDiscord(t, s, "870", "970", "dm", "dm")
	c, _ := s.ConversationByRef(ctx, dm.Conversation)
	a := enqueue(t, s, NewEffect{Session: "default", Kind: EffectSend, ConversationID: c.ID, IdempotencyKey: "x1/1", Nonce: "nn1",
		Text: "one", Held: true, Reason: "held by delivery.review: one"})
	b := enqueue(t, s, NewEffect{Session: "default", Kind: EffectSend, ConversationID: c.ID, IdempotencyKey: "x1/2", Nonce: "nn2",
		Text: "two", Held: true, Reason: "held by delivery.review: two"})
	enqueue(t, s, NewEffect{Session: "default", Kind: EffectSend, ConversationID: c.ID, IdempotencyKey: "x1/3", Nonce: "nn3", Text: "allowed"})
	list, err := s.HeldToNotify(ctx, 10)
	if err != nil || len(list) != 2 || list[0].ID != a.ID || list[1].ID != b.ID {
		t.Fatalf("to notify: %+v %v; want the two held effects, oldest first", list, err)
	}
	for _, bad := range []HeldNotice{{EffectID: a.ID, State: "sent"}, {EffectID: a.ID, State: "maybe"}} {
		if err := s.Write(ctx, func(tx *Tx) error { return tx.RecordHeldNotice(bad) }); !errors.Is(err, ErrNoticeState) {
			t.Fatalf("recorded %+v: %v", bad, err)
		}
	}
	if err := s.Write(ctx, func(tx *Tx) error {
		return tx.RecordHeldNotice(HeldNotice{EffectID: 9999, State: "failed", Error: "x"})
	}); !errors.Is(err, ErrUnknownEffect) {
		t.Fatalf("a notice of an unknown effect: %v", err)
	}
	mustWrite(t, s, func(tx *Tx) error {
		return tx.RecordHeldNotice(HeldNotice{EffectID: a.ID, State: "sent", MessageID: "123"})
	})
	mustWrite(t, s, func(tx *Tx) error {
		return tx.RecordHeldNotice(HeldNotice{EffectID: a.ID, State: "failed", Error: "late"})
	})
	if n, ok, err := s.HeldNoticeOf(ctx, a.ID); err != nil || !ok || n.State != "sent" || n.MessageID != "123" {
		t.Fatalf("a's notice: %+v %v %v; want the first outcome", n, ok, err)
	}
	if _, err := s.DecideHeld(ctx, b.ID, false, "the operator (test)"); err != nil {
		t.Fatal(err)
	}
	if list, _ := s.HeldToNotify(ctx, 10); len(list) != 0 {
		t.Fatalf("handed out again: %+v", list)
	}
}
