package store

import (
	"context"
	"strings"
	"testing"
)

func TestConversationLog(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	_, dm := admitDiscord(t, s, "700", "940", "channel", "mention")
	admitDiscord(t, s, "701", "940", "channel", "ambient")
	admitDiscord(t, s, "702", "941", "dm", "dm") // another conversation
	c, _ := s.ConversationByRef(ctx, dm.Conversation)
	e := enqueue(t, s, NewEffect{Session: "default", Kind: EffectSend, ConversationID: c.ID, IdempotencyKey: "v/1", Nonce: "v1",
		Text: "on it", ItemID: dm.ItemID})
	claim(t, s)
	if _, err := settle(s, e.ID, Outcome{State: EffectConfirmed, MessageID: "800", Evidence: "response"}); err != nil {
		t.Fatal(err)
	}
	conv, log, err := s.ConversationLog(ctx, dm.Conversation, 100)
	if err != nil {
		t.Fatal(err)
	}
	if conv.Alias != dm.Conversation || conv.Kind != "channel" {
		t.Fatalf("conversation %+v", conv)
	}
	if len(log) != 3 {
		t.Fatalf("%d lines, want the two messages of %s and its send: %+v", len(log), dm.Conversation, log)
	}
	if log[0].Mode != "mention" || log[0].ItemID != dm.ItemID || !strings.Contains(string(log[0].Content), "hi 700") {
		t.Errorf("first line %+v, want the mention with its item", log[0])
	}
	if log[1].Mode != "ambient" || log[1].ItemID != 0 {
		t.Errorf("second line %+v, want the ambient message without an item", log[1])
	}
	if log[2].EffectID != e.ID || log[2].State != EffectConfirmed || log[2].MessageID != "800" || log[2].Text != "on it" {
		t.Errorf("third line %+v, want the confirmed send with its receipt", log[2])
	}
	// The newest lines when a page is smaller than the conversation.
	if _, log, _ := s.ConversationLog(ctx, dm.Conversation, 1); len(log) != 1 || log[0].EffectID != e.ID {
		t.Errorf("a page of 1: %+v, want the newest line", log)
	}
	counts, err := s.ConversationCounts(ctx)
	if err != nil || counts[dm.Conversation].Messages != 2 || counts[dm.Conversation].LastInput != log[1].InputID || len(counts) != 2 {
		t.Errorf("counts %+v, %v: want 2 messages in %s, the newest input %d", counts, err, dm.Conversation, log[1].InputID)
	}
	if _, _, err := s.ConversationLog(ctx, "d99", 10); err == nil {
		t.Error("an unknown conversation was read")
	}
}
