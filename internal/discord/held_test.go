package discord

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/discordtest"
	"github.com/klbr-dev/klbr/internal/ingress"
	"github.com/klbr-dev/klbr/internal/session"
	"github.com/klbr-dev/klbr/internal/store"
)

// enqueueHeld records a send delivery.review held, as the ops do.
func enqueueHeld(t *testing.T, c *core, alias, key, text string) store.Effect {
	t.Helper()
	conv, err := c.store.ConversationByRef(context.Background(), alias)
	if err != nil {
		t.Fatal(err)
	}
	var e store.Effect
	if err := c.store.Write(context.Background(), func(tx *store.Tx) (err error) {
		e, err = tx.EnqueueEffect(store.NewEffect{Session: session.DefaultID, Kind: store.EffectSend, ConversationID: conv.ID,
			IdempotencyKey: key, Nonce: "k" + strings.Repeat(key[len(key)-1:], 24), Text: text, Held: true,
			Reason: "held by delivery.review: it mentions a password"})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	c.server.Kick()
	return e
}

// buttons reads a message's button custom ids.
func buttons(s discordtest.Sent) []string {
	var rows []struct {
		Components []struct {
			CustomID string `json:"custom_id"`
		} `json:"components"`
	}
	json.Unmarshal(s.Components, &rows)
	var out []string
	for _, r := range rows {
		for _, b := range r.Components {
			out = append(out, b.CustomID)
		}
	}
	return out
}

// With operator_user_id and notify_held, each held send is DMed to the
// operator once, with the command that releases it and Release and Drop
// buttons. A press by someone else is answered (only they see it) and
// decides nothing; a press Discord delivers after its 3-second window
// decides nothing either; the operator's press is acknowledged in time,
// releases the send (delivered once, its receipt naming the button) and
// edits the DM, its buttons removed; Drop drops. A restart sends no second
// DM.
func TestAHeldSendIsReleasedByTheOperatorsButton(t *testing.T) {
	dir := t.TempDir()
	c := startCoreWith(t, dir, func(cfg *ingress.Config) { cfg.Operator = "8" })
	fake := discordtest.New("99")
	defer fake.Close()
	withOperator := func(cfg *Config) { cfg.Operator = "8"; cfg.Probe.Interval = -1 }
	stop := runTransportStoppable(t, fake, c.socket, withOperator)
	fake.Dispatch("MESSAGE_CREATE", discordtest.Message("15001", "20", "", "5", "what's the password?"))
	waitFor(t, "the DM", func() bool { return len(pending(t, c)) == 1 })
	items, _ := c.store.AttentionItems(context.Background(), session.DefaultID, nil, 10)
	a := enqueueHeld(t, c, items[0].Conversation, "x1/1", "the password is in the vault")
	b := enqueueHeld(t, c, items[0].Conversation, "x1/2", "the other password is on the fridge")

	var notices []discordtest.Sent
	waitFor(t, "the operator's DMs", func() bool {
		notices = nil
		for _, s := range fake.Sent() {
			if s.ChannelID == fake.DMChannel("8") && s.ChannelID != "" {
				notices = append(notices, s)
			}
		}
		return len(notices) == 2
	})
	na := notices[0]
	if !strings.Contains(na.Content, "the password is in the vault") || !strings.Contains(na.Content, "it mentions a password") ||
		!strings.Contains(na.Content, fmt.Sprintf("klbr-core release %d", a.ID)) {
		t.Fatalf("the notice: %q; want the text, the reason and the command that releases it", na.Content)
	}
	if got := buttons(na); len(got) != 2 || got[0] != fmt.Sprintf("klbr:release:%d", a.ID) || got[1] != fmt.Sprintf("klbr:drop:%d", a.ID) {
		t.Fatalf("the notice's buttons: %q", got)
	}
	waitFor(t, "the notices recorded", func() bool {
		n, ok, _ := c.store.HeldNoticeOf(context.Background(), a.ID)
		return ok && n.State == "sent" && n.MessageID == na.ID
	})

	// Someone else presses Release: answered, only to them; nothing decided.
	other := fake.Press(na.ID, fmt.Sprintf("klbr:release:%d", a.ID), "6", 0)
	waitFor(t, "the stranger's press answered", func() bool { return fake.Interaction(other).Response != 0 })
	if ix := fake.Interaction(other); ix.Response != discordtest.ResponseMessage || !ix.Ephemeral || !strings.Contains(ix.Content, "Only klbr's operator") {
		t.Fatalf("the stranger's press was answered %+v", ix)
	}
	// The operator's press delivered after Discord's window: nothing decided.
	late := fake.Press(na.ID, fmt.Sprintf("klbr:release:%d", a.ID), "8", 4*time.Second)
	waitFor(t, "the late press refused", func() bool { return fake.Interaction(late).Late == 1 })
	time.Sleep(300 * time.Millisecond)
	if e, _ := c.store.Effect(context.Background(), a.ID); e.State != store.EffectHeld {
		t.Fatalf("after the stranger's and the late press the send is %s", e.State)
	}

	// The operator presses Release in time.
	press := fake.Press(na.ID, fmt.Sprintf("klbr:release:%d", a.ID), "8", 0)
	got := settled(t, c, a.ID)
	if got.State != store.EffectConfirmed || !strings.Contains(got.ReleasedBy, "Discord user 8") {
		t.Fatalf("released: %+v", got)
	}
	waitFor(t, "the DM edited", func() bool { return len(fake.Interaction(press).Edits) == 1 })
	ix := fake.Interaction(press)
	if ix.Response != discordtest.ResponseDeferredUpdate || !strings.Contains(ix.Edits[0], "Released") {
		t.Fatalf("the operator's press: %+v", ix)
	}
	for _, s := range fake.Sent() {
		if s.ID == na.ID && len(buttons(s)) != 0 {
			t.Fatalf("the decided notice still has buttons: %s", s.Components)
		}
	}
	// Drop the other.
	drop := fake.Press(notices[1].ID, fmt.Sprintf("klbr:drop:%d", b.ID), "8", 0)
	waitFor(t, "the drop", func() bool { e, _ := c.store.Effect(context.Background(), b.ID); return e.State == store.EffectFailed })
	waitFor(t, "the dropped DM edited", func() bool { return len(fake.Interaction(drop).Edits) == 1 })
	// A second press on the released one (an old client): nothing changes.
	again := fake.Press(na.ID, fmt.Sprintf("klbr:drop:%d", a.ID), "8", 0)
	waitFor(t, "the second press", func() bool { return len(fake.Interaction(again).Edits) == 1 })
	if !strings.Contains(fake.Interaction(again).Edits[0], "Nothing changed") {
		t.Fatalf("a second press: %q", fake.Interaction(again).Edits)
	}

	stop()
	runTransportStoppable(t, fake, c.socket, withOperator)
	time.Sleep(500 * time.Millisecond)
	var sends, dms int
	for _, s := range fake.Sent() {
		switch s.ChannelID {
		case "20":
			sends++
		case fake.DMChannel("8"):
			dms++
		}
	}
	if sends != 1 || dms != 2 {
		t.Fatalf("%d sends in the DM and %d notices, want the released send once and one notice per held send", sends, dms)
	}
}
