package daemon

import (
	"context"
	"strings"
	"testing"

	"github.com/klbr-dev/klbr/internal/discordtest"
	"github.com/klbr-dev/klbr/internal/modeltest"
	"github.com/klbr-dev/klbr/internal/store"
)

// heldReview holds a send that mentions a password and a 🔥 reaction.
const heldReview = `
from . import _shape

def review(data):
    _shape.mapping(data, "input")
    if "password" in data.get("text", ""):
        return {"decision": "hold", "reason": "it mentions a password"}
    if data.get("kind") == "react" and data.get("text") == "🔥":
        return {"decision": "hold", "reason": "no fire"}
    return {"decision": "allow", "reason": "fine"}
`

// A send and a reaction delivery.review holds wait for the operator (status,
// /metrics, klbr-core held); the released send is delivered exactly once with
// a receipt naming the release, the dropped reaction never reaches Discord,
// and a second decision is refused.
func TestHeldSendsTheOperatorReleasesOrDrops(t *testing.T) {
	model := modeltest.New()
	defer model.Close()
	model.Then(
		modeltest.Reply{Calls: []modeltest.Call{{ID: "h1", Code: "c = await discord.current()\n" +
			"r = await c.send('the password is in the vault')\nprint('send', r.state, r.delivered)\n" +
			"x = await c.react('8301', '🔥')\nprint('react', x.state)\n" +
			"y = await c.react('8301', '👍')\nprint('thumbs', y.state)"}}},
		modeltest.Reply{Calls: []modeltest.Call{{ID: "h2", Code: "await runtime.wait(None, reason='asked the operator')"}}},
	)
	model.Otherwise(func(int) modeltest.Reply {
		return modeltest.Reply{Calls: []modeltest.Call{{Code: "await runtime.wait(None)"}}}
	})
	a := startAgentWithTree(t, model, "", map[string]string{"klbr_hooks/delivery.py": heldReview})
	fake := discordtest.New("99")
	defer fake.Close()
	startTransport(t, fake, a.data)
	a.eventually("the gateway session", fake.Connected)
	fake.Dispatch("MESSAGE_CREATE", discordtest.Message("8301", "83", "", "5", "what's the password?"))
	ctx := context.Background()
	var held []store.Effect
	a.eventually("two held effects", func() bool {
		h, err := a.c.Held(ctx, 10)
		held = h.Effects
		return err == nil && len(held) == 2
	})
	a.eventually("the 👍 reaction", func() bool { return len(fake.Reactions()) == 1 })
	var cell string
	a.eventually("the cell's outcome", func() bool {
		for _, r := range a.kinds(store.LaneCell, "cell.finished") {
			if strings.Contains(string(r.Content), "thumbs") {
				cell = string(r.Content)
			}
		}
		return cell != ""
	})
	if !strings.Contains(cell, "send held False") || !strings.Contains(cell, "react held") || !strings.Contains(cell, "thumbs confirmed") {
		t.Fatalf("the cell saw %s", cell)
	}
	send, react := held[0], held[1]
	if send.Kind != store.EffectSend || send.HeldReason != "held by delivery.review: it mentions a password" || react.Kind != store.EffectReact {
		t.Fatalf("held: %+v", held)
	}
	st, err := a.c.Status(ctx)
	if err != nil || st.Held != 2 {
		t.Fatalf("status says %d held (%v)", st.Held, err)
	}
	if m := a.scrape(); !strings.Contains(m, `klbr_outbox_effects{kind="send",state="held"} 1`) || !strings.Contains(m, `klbr_outbox_effects{kind="react",state="held"} 1`) {
		t.Fatalf("/metrics lacks the held effects")
	}
	if len(fake.Sent()) != 0 {
		t.Fatalf("a held send reached Discord: %+v", fake.Sent())
	}

	rel, err := a.c.Release(ctx, send.ID, "checked: it names no password")
	if err != nil || rel.State == store.EffectHeld || !strings.Contains(rel.ReleasedBy, "uid") {
		t.Fatalf("release: %+v %v", rel, err)
	}
	if _, err := a.c.Release(ctx, send.ID, ""); err == nil || !strings.Contains(err.Error(), "not held") {
		t.Fatalf("a second release: %v", err)
	}
	if _, err := a.c.Drop(ctx, send.ID, ""); err == nil {
		t.Fatal("dropped a released send")
	}
	dropped, err := a.c.Drop(ctx, react.ID, "")
	if err != nil || dropped.State != store.EffectFailed || dropped.ErrorCode != "dropped" {
		t.Fatalf("drop: %+v %v", dropped, err)
	}
	a.eventually("the released send delivered", func() bool { return len(fake.Sent()) == 1 })
	var sent store.Record
	a.eventually("its receipt", func() bool {
		rs := a.kinds(store.LaneSpeech, "discord.sent")
		if len(rs) == 1 {
			sent = rs[0]
		}
		return len(rs) == 1
	})
	if !strings.Contains(string(sent.Content), `"released_by":"the operator (uid`) || !strings.Contains(string(sent.Content), fake.Sent()[0].ID) {
		t.Fatalf("the receipt does not name the release: %s", sent.Content)
	}
	if fake.Sent()[0].Content != "the password is in the vault" || fake.Sent()[0].ReplyTo != "" {
		t.Fatalf("Discord got %+v", fake.Sent()[0])
	}
	if n := len(fake.Reactions()); n != 1 {
		t.Fatalf("%d reactions on Discord; the dropped 🔥 went out", n)
	}
	for _, k := range []string{"discord.released", "discord.release.confirmed", "discord.dropped"} {
		if len(a.kinds(store.LaneNotice, k)) != 1 {
			t.Fatalf("no %s notice", k)
		}
	}
	if m := a.scrape(); !strings.Contains(m, `klbr_outbox_held_decisions{decision="released"} 1`) || !strings.Contains(m, `klbr_outbox_held_decisions{decision="dropped"} 1`) {
		t.Fatalf("/metrics lacks the decisions")
	}
	if st, _ := a.c.Status(ctx); st.Held != 0 {
		t.Fatalf("status still says %d held", st.Held)
	}
}
