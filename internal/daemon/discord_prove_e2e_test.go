package daemon

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/klbr-dev/klbr/internal/discordtest"
	"github.com/klbr-dev/klbr/internal/modeltest"
	"github.com/klbr-dev/klbr/internal/store"
)

// requestText is everything a model request's messages say, as JSON.
func requestText(t *testing.T, r modeltest.Request) string {
	t.Helper()
	b, err := json.Marshal(r.Messages)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// A thread created after startup (the bot not a member: Discord sends it
// nothing from there until it joins) is joined, and a mention in it wakes
// the agent: the model is asked about it and its reply goes to the thread
// (OpenClaw #7918: no events from new threads until a restart).
func TestAMessageInAThreadCreatedAfterStartupWakesTheAgent(t *testing.T) {
	model := modeltest.New()
	defer model.Close()
	model.Then(
		modeltest.Reply{Calls: []modeltest.Call{{ID: "t1", Code: "c = await discord.current()\nr = await c.send('looking at it')\nprint('sent', r.delivered)"}}},
		modeltest.Reply{Calls: []modeltest.Call{{ID: "t2", Code: "await runtime.wait(None, reason='answered')"}}},
	)
	model.Otherwise(func(int) modeltest.Reply {
		return modeltest.Reply{Calls: []modeltest.Call{{Code: "await runtime.wait(None)"}}}
	})
	a := startAgent(t, model, "")
	fake := discordtest.New("99")
	defer fake.Close()
	startTransport(t, fake, a.data)
	a.eventually("the gateway session", fake.Connected)

	fake.CreateThread("13101", "70", "7", false, nil)
	a.eventually("the new thread joined", func() bool { return fake.ThreadJoins("13101") == 1 })
	mention := discordtest.Message("13102", "13101", "7", "5", "<@99> the deploy in this thread is stuck")
	mention["mentions"] = []any{map[string]any{"id": "99"}}
	fake.Dispatch("MESSAGE_CREATE", mention)

	a.eventually("a model request about the thread's message", func() bool {
		for _, r := range model.Requests() {
			if strings.Contains(requestText(t, r), "the deploy in this thread is stuck") {
				return true
			}
		}
		return false
	})
	a.eventually("the reply in the thread", func() bool {
		for _, s := range fake.Sent() {
			if s.ChannelID == "13101" && s.Content == "looking at it" {
				return true
			}
		}
		return false
	})
}

// The model learns what became of a send delivery.review held: the
// operator's release and the delivery that followed reach it as notices in
// its next request (Build 7: "the model sees the later outcome as a
// notice"), and so does a drop.
func TestTheModelSeesTheOutcomeOfAHeldSend(t *testing.T) {
	model := modeltest.New()
	defer model.Close()
	model.Then(
		modeltest.Reply{Calls: []modeltest.Call{{ID: "h1", Code: "c = await discord.current()\n" +
			"r = await c.send('the password is in the vault')\nprint('send', r.state)\n" +
			"r = await c.send('the other password is on the fridge')\nprint('send', r.state)"}}},
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
	fake.Dispatch("MESSAGE_CREATE", discordtest.Message("8601", "86", "", "5", "what's the password?"))
	ctx := context.Background()
	var held []store.Effect
	a.eventually("two held sends", func() bool {
		h, err := a.c.Held(ctx, 10)
		held = h.Effects
		return err == nil && len(held) == 2
	})
	a.eventually("the agent waiting", func() bool { return model.Count() >= 2 })
	asked := model.Count()
	for _, r := range model.Requests() {
		if strings.Contains(requestText(t, r), "discord.released") {
			t.Fatal("the model heard of a release before there was one")
		}
	}

	if _, err := a.c.Release(ctx, held[0].ID, "checked"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.c.Drop(ctx, held[1].ID, "not this one"); err != nil {
		t.Fatal(err)
	}
	a.eventually("the released send delivered", func() bool { return len(fake.Sent()) == 1 })
	a.eventually("the delivery's notice", func() bool { return len(a.kinds(store.LaneNotice, "discord.release.confirmed")) == 1 })
	// Whatever wakes the agent next, its request carries the outcomes.
	fake.Dispatch("MESSAGE_CREATE", discordtest.Message("8602", "86", "", "5", "so?"))
	var text string
	a.eventually("a request after the decisions", func() bool {
		rs := model.Requests()
		for _, r := range rs[asked:] {
			if s := requestText(t, r); strings.Contains(s, "so?") {
				text = s
				return true
			}
		}
		return false
	})
	for _, want := range []string{"discord.released", "discord.release.confirmed", "discord.dropped", "the password is in the vault", "the other password is on the fridge"} {
		if !strings.Contains(text, want) {
			t.Errorf("the model's next request does not say %q:\n%s", want, text)
		}
	}
}
