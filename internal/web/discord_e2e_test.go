package web

import (
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/klbr-dev/klbr/internal/discord"
	"github.com/klbr-dev/klbr/internal/discordtest"
	"github.com/klbr-dev/klbr/internal/modeltest"
	"github.com/klbr-dev/klbr/internal/store"
)

// startTransport runs klbr-discord's transport against the fake Discord and
// klbr-core's ingress socket in data.
func startTransport(t *testing.T, fake *discordtest.Fake, data string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- discord.Run(ctx, discord.Config{Token: "e2e-token", APIBase: fake.APIBase(),
			IngressSocket: filepath.Join(data, "ingress.sock"), Log: slog.New(slog.DiscardHandler)})
	}()
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { cancel(); <-done }) })
}

// The agent's Discord life in the browser, against a real klbr-core, the
// scripted model, klbr-discord's transport and the Discord fake: the
// conversations with their waiting counts; a DM whose answer was delivered
// (with its receipt) and a channel where an ambient message and a directed
// mention are told apart and the answer failed; the failed send as its own
// card in the conversation view; the operator's marks (ignore, then reopen)
// with their decision origin.
func TestBrowserDiscord(t *testing.T) {
	model := modeltest.New()
	defer model.Close()
	model.Otherwise(func(int) modeltest.Reply {
		return modeltest.Reply{Calls: []modeltest.Call{{Code: "try:\n    c = await discord.current()\nexcept discord.HostError:\n    c = None\n" +
			"if c is not None:\n    await c.send('hello **back**' if c.kind == 'dm' else 'on it')\n" +
			"await runtime.wait(None, reason='answered')"}}}
	})
	c := startCore(t, model)
	fake := discordtest.New("99")
	defer fake.Close()
	fake.OnSend = func(channel, _ string) (int, float64) {
		if channel == "11" {
			return 403, 0 // Missing Access: the answer in the channel fails
		}
		return 0, 0
	}
	startTransport(t, fake, c.data)
	c.eventually(t, "the gateway session", fake.Connected)

	fake.Dispatch("MESSAGE_CREATE", discordtest.Message("2001", "11", "7", "6", "lunch at noon, anyone?"))
	mention := discordtest.Message("2002", "11", "7", "6", "<@99> can you book it?")
	mention["mentions"] = []any{map[string]any{"id": "99"}}
	fake.Dispatch("MESSAGE_CREATE", mention)
	c.eventually(t, "the answer in the channel failed", func() bool {
		for _, r := range c.records(t) {
			if r.Kind == "discord.failed" {
				return true
			}
		}
		return false
	})
	fake.Dispatch("MESSAGE_CREATE", discordtest.Message("2003", "20", "", "5", "hey, a quick question"))
	c.eventually(t, "the reply in the DM", func() bool { return len(fake.Sent()) == 1 })
	c.eventually(t, "the DM's send confirmed", func() bool {
		for _, r := range c.records(t) {
			if r.Kind == "discord.sent" && r.Lane == store.LaneSpeech {
				return true
			}
		}
		return false
	})

	ctx := browserCtx(t)
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := chromedp.Do(ctx,
		chromedp.Navigate(c.url+"/?token="+c.token),
		chromedp.WaitVisible(chromedp.CSS(`#h-conn[data-state="live"]`)),
	); err != nil {
		t.Fatal(err)
	}
	// The conversation view: the failed send and the delivered one, distinct.
	if err := poll(ctx, `document.querySelector('#conv .entry.out.st-failed') !== null && document.querySelector('#conv .entry.out.st-sent') !== null`); err != nil {
		t.Fatalf("the sends in the conversation: %v\n%s", err, eval[string](t, ctx, `document.getElementById('conv').innerText`))
	}
	failed := eval[string](t, ctx, `document.querySelector('#conv .entry.out.st-failed').innerText`)
	if !strings.Contains(failed, "not delivered") || !strings.Contains(failed, "on it") {
		t.Errorf("failed card: %q", failed)
	}
	if eval[string](t, ctx, `getComputedStyle(document.querySelector('#conv .st-failed .bubble')).borderTopStyle`) != "dashed" {
		t.Error("the failed send is drawn like delivered speech")
	}
	screenshot(t, ctx, "home-7-discord-conversation")

	// The panel: two conversations; the channel waits (its mention is still
	// pending: the answer failed), the DM does not (its answer acted on it).
	if err := poll(ctx, `document.querySelectorAll('#discord-convs .conv-row').length === 2`); err != nil {
		t.Fatalf("conversations: %v\n%s", err, eval[string](t, ctx, `document.getElementById('panels').innerText`))
	}
	rows := eval[[]string](t, ctx, `[...document.querySelectorAll('#discord-convs .conv-row')].map(r => r.innerText.replace(/\s+/g, ' '))`)
	if len(rows) != 2 || !strings.Contains(rows[0], "d1") || !strings.Contains(rows[0], "#") || !strings.HasSuffix(strings.TrimSpace(rows[0]), "unread 1") ||
		!strings.Contains(rows[1], "d2") || !strings.Contains(rows[1], "DM") {
		t.Errorf("conversation rows %q: want d1 (a channel, 1 waiting) and d2 (the DM)", rows)
	}
	// Nothing was read in this browser yet: both messages of d1 are unread.
	if u := eval[string](t, ctx, `(document.querySelector('#discord-convs .conv-row[data-alias="d1"] .unread') || {}).textContent || ''`); u != "2 unread" {
		t.Errorf("d1's unread count: %q, want 2 unread", u)
	}
	// The channel: ambient and directed apart; the failed answer with its error.
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`#discord-convs .conv-row[data-alias="d1"]`))); err != nil {
		t.Fatal(err)
	}
	if err := poll(ctx, `document.querySelectorAll('#discord-log .dmsg').length === 3`); err != nil {
		t.Fatalf("the channel's log: %v\n%s", err, eval[string](t, ctx, `document.getElementById('discord-log').innerText`))
	}
	log := eval[map[string]any](t, ctx, `({ambient: document.querySelectorAll('#discord-log .dmsg.in.ambient').length,
		directed: document.querySelectorAll('#discord-log .dmsg.in.directed').length,
		failed: document.querySelectorAll('#discord-log .dmsg.out.st-failed').length,
		text: document.getElementById('discord-log').innerText})`)
	if log["ambient"] != 1.0 || log["directed"] != 1.0 || log["failed"] != 1.0 || !strings.Contains(log["text"].(string), "lunch at noon") ||
		!strings.Contains(log["text"].(string), "not delivered") {
		t.Errorf("the channel's log: %v", log)
	}
	screenshot(t, ctx, "home-8-discord-channel")
	// The DM: the answer with its receipt (the message id the fake gave).
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`#discord-back`))); err != nil {
		t.Fatal(err)
	}
	// Opened, d1 has nothing unread; d2, not yet opened, has its DM.
	if err := poll(ctx, `document.querySelector('#discord-convs .conv-row[data-alias="d1"] .unread') === null &&
		(document.querySelector('#discord-convs .conv-row[data-alias="d2"] .unread') || {}).textContent === '1 unread'`); err != nil {
		t.Errorf("unread after opening d1: %v\n%s", err, eval[string](t, ctx, `document.getElementById('discord-convs').innerText`))
	}
	// Clicked in the page: the list re-renders as inputs arrive, so a node
	// found by one call may be gone by the next.
	if err := poll(ctx, `(el => !!el && (el.click(), true))(document.querySelector('#discord-convs .conv-row[data-alias="d2"]'))`); err != nil {
		t.Fatal(err)
	}
	sent := fake.Sent()[0]
	if err := poll(ctx, `document.querySelector('#discord-log .dmsg.out.st-sent') !== null`); err != nil {
		t.Fatal(err)
	}
	if s := eval[string](t, ctx, `document.getElementById('discord-log').innerText`); !strings.Contains(s, "delivered · message "+sent.ID) ||
		!strings.Contains(s, "directed · DM") {
		t.Errorf("the DM's log: %q (want the receipt of message %s)", s, sent.ID)
	}

	// Attention: the channel's mention is pending; ignore it, then reopen it.
	item := `[...document.querySelectorAll('#discord-items .item')].find(i => i.innerText.includes('message 2002'))`
	if err := poll(ctx, item+` !== undefined && `+item+`.classList.contains('st-pending')`); err != nil {
		t.Fatalf("the mention's item: %v\n%s", err, eval[string](t, ctx, `document.getElementById('discord-items').innerText`))
	}
	if err := poll(ctx, `(`+item+`.querySelector('button[data-mark="ignored"]').click(), true)`); err != nil {
		t.Fatal(err)
	}
	if err := poll(ctx, item+`.classList.contains('st-ignored') && `+item+`.innerText.includes('by operator')`); err != nil {
		t.Fatalf("ignore: %v\n%s", err, eval[string](t, ctx, `document.getElementById('discord-items').innerText`))
	}
	screenshot(t, ctx, "home-9-discord-items")
	if err := poll(ctx, `(`+item+`.querySelector('button[data-mark="pending"]').click(), true)`); err != nil {
		t.Fatal(err)
	}
	if err := poll(ctx, item+`.classList.contains('st-pending')`); err != nil {
		t.Fatalf("reopen: %v", err)
	}
}
