package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// admitDiscord admits one Discord message in channel ch with the given mode.
func admitDiscord(t *testing.T, s *Store, msgID, ch, kind, mode string) (Admitted, DiscordAdmitted) {
	t.Helper()
	var a Admitted
	var d DiscordAdmitted
	mustWrite(t, s, func(tx *Tx) (err error) {
		now := tx.Now()
		a, err = tx.AdmitInput(NewInput{Session: "default", SourceKind: "discord", SourceKey: "discord:" + msgID,
			Conversation: ConversationKey(ch), Author: "u1", Directed: mode != "ambient", OccurredAt: now, ReceivedAt: now, Body: "hi " + msgID})
		if err != nil {
			return err
		}
		d, err = tx.RecordDiscordMessage(a, DiscordMessage{Session: "default", MessageID: msgID, ChannelID: ch, ChannelKind: kind,
			AuthorID: "u1", Mode: mode})
		return err
	})
	return a, d
}

func TestConversationAliasesAreDurable(t *testing.T) {
	dir := t.TempDir()
	s := openTest(t, dir, Options{})
	mustWrite(t, s, func(tx *Tx) error { _, err := tx.EnsureSession("default"); return err })
	_, d1 := admitDiscord(t, s, "100", "900", "channel", "ambient")
	_, d2 := admitDiscord(t, s, "101", "901", "dm", "dm")
	_, again := admitDiscord(t, s, "102", "900", "channel", "ambient")
	if d1.Conversation != "d1" || d2.Conversation != "d2" || again.Conversation != "d1" {
		t.Fatalf("aliases: %q %q %q, want d1 d2 d1", d1.Conversation, d2.Conversation, again.Conversation)
	}
	if d1.ItemID != 0 || d2.ItemID == 0 {
		t.Fatalf("items: ambient %d (want none), dm %d (want one)", d1.ItemID, d2.ItemID)
	}
	s.Close()
	s = openTest(t, dir, Options{})
	_, d3 := admitDiscord(t, s, "103", "902", "channel", "mention")
	if d3.Conversation != "d3" {
		t.Fatalf("after reopen the next alias is %q, want d3", d3.Conversation)
	}
	c, err := s.ConversationByRef(context.Background(), "d2")
	if err != nil || c.ChannelID != "901" || c.Pending != 1 {
		t.Fatalf("d2 = %+v, %v; want channel 901 with one pending item", c, err)
	}
	if _, err := s.ConversationByRef(context.Background(), "d9"); !errors.Is(err, ErrUnknownConversation) {
		t.Fatalf("unknown alias: %v", err)
	}
	// A duplicate delivery records nothing new and answers the first identity.
	a, dup := admitDiscord(t, s, "101", "901", "dm", "dm")
	if !a.Duplicate || dup.ItemID != d2.ItemID || dup.Conversation != "d2" {
		t.Fatalf("duplicate: %+v %+v", a, dup)
	}
	items, _ := s.AttentionItems(context.Background(), "default", nil, 10)
	if len(items) != 2 {
		t.Fatalf("items = %d, want 2 (dm and mention)", len(items))
	}
}

func TestAttentionTransitions(t *testing.T) {
	s := newStore(t)
	_, d := admitDiscord(t, s, "200", "910", "dm", "dm")
	_, other := admitDiscord(t, s, "201", "911", "channel", "mention")
	mark := func(id int64, to, origin string, conv int64) error {
		return s.Write(context.Background(), func(tx *Tx) error { _, err := tx.Mark(id, to, origin, "n", conv); return err })
	}
	conv := func(ref string) int64 {
		c, err := s.ConversationByRef(context.Background(), ref)
		if err != nil {
			t.Fatal(err)
		}
		return c.ID
	}
	tests := []struct {
		name   string
		item   int64
		to     string
		origin string
		conv   int64
		want   error
	}{
		{"an item of another conversation", d.ItemID, ItemIgnored, OriginModel, conv(other.Conversation), ErrItemElsewhere},
		{"pending to seen", d.ItemID, ItemSeen, OriginModel, conv(d.Conversation), nil},
		{"seen to ignored", d.ItemID, ItemIgnored, OriginModel, 0, nil},
		{"ignored cannot become acted", d.ItemID, ItemActed, OriginDelivery, 0, ErrAttentionMove},
		{"aging cannot reopen", d.ItemID, ItemPending, OriginAging, 0, ErrAttentionMove},
		{"explicit reopen", d.ItemID, ItemPending, OriginModel, 0, nil},
		{"unknown origin", d.ItemID, ItemSeen, "guess", 0, ErrAttentionMove},
		{"unknown item", 999, ItemSeen, OriginModel, 0, ErrUnknownItem},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := mark(tc.item, tc.to, tc.origin, tc.conv)
			if tc.want == nil && err != nil || tc.want != nil && !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
		})
	}
	// The schema refuses what Mark refuses, whoever writes.
	err := s.Write(context.Background(), func(tx *Tx) error {
		_, err := tx.exec(`UPDATE attention_items SET status = 'acted' WHERE id = ?`, other.ItemID)
		if err != nil {
			return err
		}
		_, err = tx.exec(`UPDATE attention_items SET status = 'pending', decision_origin = 'aging' WHERE id = ?`, other.ItemID)
		return err
	})
	if err == nil {
		t.Fatal("the schema let aging reopen an acted item")
	}
}

func TestAgingRecordsItsOrigin(t *testing.T) {
	now := time.UnixMilli(1_000_000)
	s := openTest(t, t.TempDir(), Options{Clock: func() time.Time { return now }})
	mustWrite(t, s, func(tx *Tx) error { _, err := tx.EnsureSession("default"); return err })
	_, old := admitDiscord(t, s, "300", "920", "dm", "dm")
	now = now.Add(10 * time.Minute)
	_, fresh := admitDiscord(t, s, "301", "920", "dm", "dm")
	var n int64
	mustWrite(t, s, func(tx *Tx) (err error) {
		n, err = tx.AgePending(now.Add(-5*time.Minute), "aged out")
		return err
	})
	if n != 1 {
		t.Fatalf("aged %d, want 1", n)
	}
	it, _ := s.AttentionItem(context.Background(), old.ItemID)
	if it.Status != ItemIgnored || it.DecisionOrigin != OriginAging {
		t.Fatalf("old item: %s by %s, want ignored by aging", it.Status, it.DecisionOrigin)
	}
	it, _ = s.AttentionItem(context.Background(), fresh.ItemID)
	if it.Status != ItemPending {
		t.Fatalf("fresh item is %s", it.Status)
	}
}

func enqueue(t *testing.T, s *Store, n NewEffect) Effect {
	t.Helper()
	var e Effect
	mustWrite(t, s, func(tx *Tx) (err error) { e, err = tx.EnqueueEffect(n); return err })
	return e
}

func claim(t *testing.T, s *Store) []Effect {
	t.Helper()
	var es []Effect
	mustWrite(t, s, func(tx *Tx) (err error) { es, err = tx.ClaimEffects(10); return err })
	return es
}

func settle(s *Store, id int64, o Outcome) (Effect, error) {
	var e Effect
	err := s.Write(context.Background(), func(tx *Tx) (err error) { e, err = tx.SettleEffect(id, o); return err })
	return e, err
}

func TestConfirmedSendMarksOnlyItsItemAndConsumesTheAnchor(t *testing.T) {
	s := newStore(t)
	_, dm := admitDiscord(t, s, "400", "930", "dm", "dm")
	_, mention := admitDiscord(t, s, "401", "931", "channel", "mention")
	c, _ := s.ConversationByRef(context.Background(), dm.Conversation)
	e := enqueue(t, s, NewEffect{Session: "default", Kind: EffectSend, ConversationID: c.ID, IdempotencyKey: "x1/1", Nonce: "n1",
		Text: "hello", ItemID: dm.ItemID})
	if e.Target != "400" {
		t.Fatalf("anchor = %q, want the DM's message 400", e.Target)
	}
	again := enqueue(t, s, NewEffect{Session: "default", Kind: EffectSend, ConversationID: c.ID, IdempotencyKey: "x1/1", Nonce: "n1-other",
		Text: "hello", ItemID: dm.ItemID})
	if !again.Repeat || again.ID != e.ID {
		t.Fatalf("a repeated idempotency key made a new effect: %+v", again)
	}
	second := enqueue(t, s, NewEffect{Session: "default", Kind: EffectSend, ConversationID: c.ID, IdempotencyKey: "x1/2", Nonce: "n2",
		Text: "and more", ItemID: dm.ItemID})
	if second.Target != "" {
		t.Fatalf("a second send took the reserved anchor: %q", second.Target)
	}
	cl := claim(t, s)
	if len(cl) != 2 || cl[0].State != EffectAttempting || cl[0].ReplyReference {
		t.Fatalf("claimed %+v; want two attempting, the first a plain message (the channel has not advanced)", cl)
	}
	if _, err := settle(s, e.ID, Outcome{State: EffectConfirmed}); !errors.Is(err, ErrOutboxMove) {
		t.Fatalf("a confirmed send without a message id: %v", err)
	}
	got, err := settle(s, e.ID, Outcome{State: EffectConfirmed, MessageID: "500", Evidence: "response"})
	if err != nil || got.State != EffectConfirmed {
		t.Fatalf("settle: %+v %v", got, err)
	}
	it, _ := s.AttentionItem(context.Background(), dm.ItemID)
	if it.Status != ItemActed || it.DecisionOrigin != OriginDelivery {
		t.Fatalf("dm item: %s by %s; want acted by delivery", it.Status, it.DecisionOrigin)
	}
	it, _ = s.AttentionItem(context.Background(), mention.ItemID)
	if it.Status != ItemPending {
		t.Fatalf("the other item became %s", it.Status)
	}
	if rep, err := settle(s, e.ID, Outcome{State: EffectConfirmed, MessageID: "500"}); err != nil || !rep.Repeat {
		t.Fatalf("a repeated receipt: %+v %v", rep, err)
	}
	if _, err := settle(s, e.ID, Outcome{State: EffectFailed}); !errors.Is(err, ErrOutboxMove) {
		t.Fatalf("confirmed became failed: %v", err)
	}
	// The anchor is consumed: a later send answering the same item carries none.
	third := enqueue(t, s, NewEffect{Session: "default", Kind: EffectSend, ConversationID: c.ID, IdempotencyKey: "x1/3", Nonce: "n3",
		Text: "again", ItemID: dm.ItemID})
	if third.Target != "" {
		t.Fatalf("a consumed anchor was reserved again")
	}
	recs, _ := s.Records(context.Background(), "default", 0, 100)
	var sent int
	for _, r := range recs {
		if r.Kind == "discord.sent" {
			sent++
		}
	}
	if sent != 1 {
		t.Fatalf("%d discord.sent records, want 1", sent)
	}
}

func TestFailedAndUnknownFreeTheAnchorAndAreNotDelivered(t *testing.T) {
	s := newStore(t)
	_, dm := admitDiscord(t, s, "600", "940", "dm", "dm")
	c, _ := s.ConversationByRef(context.Background(), dm.Conversation)
	for i, state := range []string{EffectFailed, EffectUnknown} {
		e := enqueue(t, s, NewEffect{Session: "default", Kind: EffectSend, ConversationID: c.ID, IdempotencyKey: fmt.Sprintf("k%d", i),
			Nonce: fmt.Sprintf("n%d", i), Text: "hello", ItemID: dm.ItemID})
		if e.Target != "600" {
			t.Fatalf("%s: the anchor was not free again: %q", state, e.Target)
		}
		// The channel advanced meanwhile: the send now needs a reply reference.
		admitDiscord(t, s, fmt.Sprintf("60%d", i+1), "940", "dm", "ambient")
		cl := claim(t, s)
		if len(cl) != 1 || !cl[0].ReplyReference {
			t.Fatalf("claimed %+v; want a reply reference once the channel advanced", cl)
		}
		if _, err := settle(s, e.ID, Outcome{State: state, ErrorCode: "http_403", Error: "Missing Access"}); err != nil {
			t.Fatal(err)
		}
	}
	it, _ := s.AttentionItem(context.Background(), dm.ItemID)
	if it.Status != ItemPending {
		t.Fatalf("an undelivered send moved its item to %s", it.Status)
	}
	recs, _ := s.Records(context.Background(), "default", 0, 100)
	for _, r := range recs {
		if r.Kind == "discord.sent" {
			t.Fatalf("an undelivered send was recorded as sent: %s", r.Content)
		}
	}
	// Evidence found later settles the unknown one as confirmed, once.
	if e, err := settle(s, 2, Outcome{State: EffectConfirmed, MessageID: "700", Evidence: "nonce in history"}); err != nil || e.State != EffectConfirmed {
		t.Fatalf("unknown to confirmed: %+v %v", e, err)
	}
	// A held send never reaches the transport (unless the operator releases it).
	h := enqueue(t, s, NewEffect{Session: "default", Kind: EffectSend, ConversationID: c.ID, IdempotencyKey: "held", Nonce: "nh",
		Text: "no", Held: true, Reason: "review said no"})
	if h.State != EffectHeld || h.ErrorCode != "held" {
		t.Fatalf("held: %+v", h)
	}
	if cl := claim(t, s); len(cl) != 0 {
		t.Fatalf("claimed a held send: %+v", cl)
	}
}

func TestOutboxTransitionsInSchema(t *testing.T) {
	s := newStore(t)
	_, dm := admitDiscord(t, s, "800", "950", "dm", "dm")
	c, _ := s.ConversationByRef(context.Background(), dm.Conversation)
	e := enqueue(t, s, NewEffect{Session: "default", Kind: EffectReact, ConversationID: c.ID, IdempotencyKey: "r", Nonce: "nr",
		Emoji: "❤️", Target: "800"})
	if _, err := settle(s, e.ID, Outcome{State: EffectConfirmed}); !errors.Is(err, ErrOutboxMove) {
		t.Fatalf("settled a pending effect: %v", err)
	}
	err := s.Write(context.Background(), func(tx *Tx) error {
		_, err := tx.exec(`UPDATE discord_outbox SET state = 'confirmed', settled_at = 1 WHERE id = ?`, e.ID)
		return err
	})
	if err == nil {
		t.Fatal("the schema let a pending effect become confirmed without an attempt")
	}
}

// A send delivery.review held waits for the operator: it is never claimed;
// released, it goes out once (a second release or a drop is refused) and its
// receipt names who released it; dropped, it fails for good.
func TestHeldSendIsReleasedOnceOrDropped(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	_, dm := admitDiscord(t, s, "850", "960", "dm", "dm")
	c, _ := s.ConversationByRef(ctx, dm.Conversation)
	held := enqueue(t, s, NewEffect{Session: "default", Kind: EffectSend, ConversationID: c.ID, IdempotencyKey: "x1/1", Nonce: "nh1",
		Text: "a risky reply", ItemID: dm.ItemID, Held: true, Reason: "held by delivery.review: mentions a password"})
	other := enqueue(t, s, NewEffect{Session: "default", Kind: EffectReact, ConversationID: c.ID, IdempotencyKey: "x1/2", Nonce: "nh2",
		Emoji: "🔥", Target: "850", Held: true, Reason: "held by delivery.review: no fire"})
	if held.State != EffectHeld || held.HeldReason == "" || held.SettledAt != nil {
		t.Fatalf("held effect: %+v", held)
	}
	if es := claim(t, s); len(es) != 0 {
		t.Fatalf("the transport claimed a held effect: %+v", es)
	}
	list, err := s.HeldEffects(ctx, 10)
	if err != nil || len(list) != 2 {
		t.Fatalf("held listing: %d %v", len(list), err)
	}
	var rel Effect
	mustWrite(t, s, func(tx *Tx) (err error) { rel, err = tx.ReleaseEffect(held.ID, "operator (uid 1000)"); return err })
	if rel.State != EffectPending || rel.ReleasedBy != "operator (uid 1000)" || rel.Target != "850" {
		t.Fatalf("released: %+v; want pending, named, with the item's anchor", rel)
	}
	for _, again := range []func(tx *Tx) error{
		func(tx *Tx) error { _, err := tx.ReleaseEffect(held.ID, "someone"); return err },
		func(tx *Tx) error { _, err := tx.DropEffect(held.ID, "someone"); return err },
	} {
		if err := s.Write(ctx, again); !errors.Is(err, ErrOutboxMove) {
			t.Fatalf("a second decision on a released effect: %v", err)
		}
	}
	es := claim(t, s)
	if len(es) != 1 || es[0].ID != held.ID {
		t.Fatalf("claimed %+v, want the released send", es)
	}
	sent, err := settle(s, held.ID, Outcome{State: EffectConfirmed, MessageID: "851", Evidence: "response"})
	if err != nil || sent.ReleasedBy != "operator (uid 1000)" {
		t.Fatalf("settle: %+v %v", sent, err)
	}
	if it, _ := s.AttentionItem(ctx, dm.ItemID); it.Status != ItemActed {
		t.Fatalf("the DM's item is %s after the released answer was delivered", it.Status)
	}
	var dropped Effect
	mustWrite(t, s, func(tx *Tx) (err error) { dropped, err = tx.DropEffect(other.ID, "operator (uid 0)"); return err })
	if dropped.State != EffectFailed || dropped.ErrorCode != "dropped" || dropped.SettledAt == nil {
		t.Fatalf("dropped: %+v", dropped)
	}
	if err := s.Write(ctx, func(tx *Tx) error { _, err := tx.ReleaseEffect(other.ID, "x"); return err }); !errors.Is(err, ErrOutboxMove) {
		t.Fatalf("released a dropped effect: %v", err)
	}
	if list, _ := s.HeldEffects(ctx, 10); len(list) != 0 {
		t.Fatalf("%d still held", len(list))
	}
	recs, _ := s.Records(ctx, "default", 0, 100)
	var kinds []string
	for _, r := range recs {
		if strings.HasPrefix(r.Kind, "discord.") && r.Kind != "discord.input" {
			kinds = append(kinds, r.Kind)
		}
	}
	want := "discord.held discord.react.held discord.released discord.sent discord.release.confirmed discord.dropped discord.react.failed"
	if strings.Join(kinds, " ") != want {
		t.Fatalf("records %v, want %s", kinds, want)
	}
	// The schema itself refuses a held effect that skips the operator.
	e := enqueue(t, s, NewEffect{Session: "default", Kind: EffectSend, ConversationID: c.ID, IdempotencyKey: "x1/3", Nonce: "nh3", Text: "t", Held: true})
	if err := s.Write(ctx, func(tx *Tx) error {
		_, err := tx.exec(`UPDATE discord_outbox SET state = 'attempting' WHERE id = ?`, e.ID)
		return err
	}); err == nil {
		t.Fatal("the schema let a held effect be attempted")
	}
}

// A conversation's backfill cursor is the newest message admitted from it,
// in snowflake order whatever the order of admission; migration 0027 sets
// it for conversations admitted before the column existed.
func TestTheInboundCursorIsTheNewestAdmitted(t *testing.T) {
	s := openTest(t, t.TempDir(), Options{})
	mustWrite(t, s, func(tx *Tx) error { _, err := tx.EnsureSession("default"); return err })
	admitDiscord(t, s, "1000", "900", "dm", "dm")
	admitDiscord(t, s, "999", "900", "dm", "dm") // a backfilled older one, admitted later
	admitDiscord(t, s, "5", "901", "channel", "ambient")
	cursor := func(ref string) string {
		t.Helper()
		c, err := s.ConversationByRef(context.Background(), ref)
		if err != nil {
			t.Fatal(err)
		}
		return c.LastInboundID
	}
	if got := cursor("d1"); got != "1000" {
		t.Fatalf("cursor of d1 = %q, want 1000", got)
	}
	body, err := migrationFS.ReadFile("migrations/0027_discord_inbound_cursor.sql")
	if err != nil {
		t.Fatal(err)
	}
	_, update, ok := strings.Cut(string(body), "\nUPDATE ")
	if !ok {
		t.Fatal("0027 has no UPDATE")
	}
	mustWrite(t, s, func(tx *Tx) error {
		if _, err := tx.exec(`UPDATE discord_conversations SET last_inbound_id = ''`); err != nil {
			return err
		}
		_, err := tx.exec("UPDATE " + update)
		return err
	})
	if d1, d2 := cursor("d1"), cursor("d2"); d1 != "1000" || d2 != "5" {
		t.Fatalf("after 0027's update: d1 %q d2 %q, want 1000 and 5", d1, d2)
	}
}

// A message admitted out of order (older ones may still be on their way)
// does not move a cursor the conversation has, but gives one to a
// conversation that has none: without a cursor the backfill reads nothing,
// so a DM admitted before the transport's first hello, the first of its
// conversation, left every message after it unread by the next transport
// (internal/discord TestBackfillReadsBehindOurOwnNewestSend failed so).
func TestAnOutOfOrderMessageStartsAMissingCursorOnly(t *testing.T) {
	s := openTest(t, t.TempDir(), Options{})
	mustWrite(t, s, func(tx *Tx) error { _, err := tx.EnsureSession("default"); return err })
	admit := func(msgID string, outOfOrder bool) {
		t.Helper()
		mustWrite(t, s, func(tx *Tx) error {
			now := tx.Now()
			a, err := tx.AdmitInput(NewInput{Session: "default", SourceKind: "discord", SourceKey: "discord:" + msgID,
				Conversation: ConversationKey("900"), Author: "u1", Directed: true, OccurredAt: now, ReceivedAt: now, Body: "hi " + msgID})
			if err != nil {
				return err
			}
			_, err = tx.RecordDiscordMessage(a, DiscordMessage{Session: "default", MessageID: msgID, ChannelID: "900", ChannelKind: "dm",
				AuthorID: "u1", Mode: "dm", OutOfOrder: outOfOrder})
			return err
		})
	}
	cursor := func() string {
		t.Helper()
		c, err := s.ConversationByRef(context.Background(), "d1")
		if err != nil {
			t.Fatal(err)
		}
		return c.LastInboundID
	}
	admit("1000", true)
	if got := cursor(); got != "1000" {
		t.Fatalf("the first message, out of order, left the cursor %q; want 1000", got)
	}
	admit("1005", true)
	if got := cursor(); got != "1000" {
		t.Fatalf("a later out-of-order message moved the cursor to %q; want it to stay at 1000", got)
	}
	admit("1003", false)
	if got := cursor(); got != "1003" {
		t.Fatalf("an in-order message left the cursor %q; want 1003", got)
	}
}
