package web

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/klbr-dev/klbr/internal/discordtest"
	"github.com/klbr-dev/klbr/internal/modeltest"
	"github.com/klbr-dev/klbr/internal/store"
)

// heldReview holds every send that mentions a password.
const heldReview = `
from . import _shape

def review(data):
    _shape.mapping(data, "input")
    if "password" in data.get("text", ""):
        return {"decision": "hold", "reason": "it mentions a password"}
    return {"decision": "allow", "reason": "fine"}
`

// A send delivery.review held is listed in the browser with its reason and
// released from there: it is delivered once, with a receipt naming the
// release; another is dropped and never reaches Discord; the list empties.
// The decision is the operator API's: a second one is refused.
func TestBrowserReleasesAndDropsHeldSends(t *testing.T) {
	model := modeltest.New()
	defer model.Close()
	model.Then(modeltest.Reply{Calls: []modeltest.Call{{ID: "h1", Code: "c = await discord.current()\n" +
		"await c.send('the password is in the vault')\nawait c.send('the other password is on the fridge')\n" +
		"await runtime.wait(None, reason='asked the operator')"}}})
	model.Otherwise(func(int) modeltest.Reply {
		return modeltest.Reply{Calls: []modeltest.Call{{Code: "await runtime.wait(None)"}}}
	})
	tree := filepath.Join(t.TempDir(), "behavior")
	if err := os.CopyFS(tree, os.DirFS("../../behavior")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tree, "klbr_hooks", "delivery.py"), []byte(heldReview), 0o644); err != nil {
		t.Fatal(err)
	}
	c := startCoreEnv(t, fmt.Sprintf("[agent]\nroute = \"main\"\nretry_backoff_ms = 50\n\n[routes.main]\nurl = %q\nmodel = \"fake\"\ntimeout_seconds = 60\n", model.URL()),
		"KLBR_BEHAVIOR_DIR="+tree)
	fake := discordtest.New("99")
	defer fake.Close()
	startTransport(t, fake, c.data)
	c.eventually(t, "the gateway session", fake.Connected)
	fake.Dispatch("MESSAGE_CREATE", discordtest.Message("8301", "83", "", "5", "what's the password?"))
	var held []store.Effect
	c.eventually(t, "two held sends", func() bool {
		h, err := c.ctl.Held(t.Context(), 10)
		held = h.Effects
		return err == nil && len(held) == 2
	})

	// Status and /metrics: held sends wait for a person, and say what ends it.
	st, err := c.ctl.Status(t.Context())
	if err != nil || st.Held != 2 || st.HeldSince == nil || !st.HeldSince.Equal(held[0].CreatedAt) {
		t.Fatalf("status: %d held since %v (%v), want 2 since %v", st.Held, st.HeldSince, err, held[0].CreatedAt)
	}
	if m := scrape(t, c.url); !regexp.MustCompile(`(?m)^klbr_outbox_held_waiting_seconds [0-9.e+-]+$`).MatchString(m) ||
		strings.Contains(m, "klbr_outbox_held_waiting_seconds 0\n") || !strings.Contains(m, "Nothing ends the wait but the operator's decision") {
		t.Fatalf("/metrics does not show the held sends waiting:\n%s", m)
	}

	ctx := browserCtx(t)
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := chromedp.Do(ctx,
		chromedp.Navigate(c.url+"/?token="+c.token),
		chromedp.WaitVisible(chromedp.CSS(`#h-conn[data-state="live"]`)),
	); err != nil {
		t.Fatal(err)
	}
	if err := poll(ctx, `document.querySelectorAll('#discord-held .item.held').length === 2`); err != nil {
		t.Fatalf("the held sends: %v\n%s", err, eval[string](t, ctx, `document.getElementById('panels').innerText`))
	}
	row := func(id int64) string {
		return fmt.Sprintf(`document.querySelector('#discord-held .item.held[data-effect="%d"]')`, id)
	}
	text := eval[string](t, ctx, row(held[0].ID)+`.innerText`)
	if !strings.Contains(text, "the password is in the vault") || !strings.Contains(text, "it mentions a password") ||
		!strings.Contains(text, fmt.Sprintf("klbr-core release %d", held[0].ID)) {
		t.Errorf("the held send's row: %q (want its text, its reason and what ends it)", text)
	}
	// The conversation's held card says why, and where it waits.
	if err := poll(ctx, `[...document.querySelectorAll('#conv .entry.out.st-held')].some(e => e.innerText.includes('it mentions a password') && e.innerText.includes('waits for you'))`); err != nil {
		t.Errorf("the held card: %v\n%s", err, eval[string](t, ctx, `document.getElementById('conv').innerText`))
	}
	if b := eval[string](t, ctx, `document.getElementById('held-badge').textContent`); b != "2" {
		t.Errorf("held badge %q, want 2", b)
	}
	screenshot(t, ctx, "home-10-held-sends")
	if len(fake.Sent()) != 0 {
		t.Fatalf("a held send reached Discord: %+v", fake.Sent())
	}
	// The page asks before it decides; the test says yes.
	eval[bool](t, ctx, `(window.confirm = () => true, true)`)
	if err := poll(ctx, `(`+row(held[0].ID)+`.querySelector('button[data-decide="release"]').click(), true)`); err != nil {
		t.Fatal(err)
	}
	c.eventually(t, "the released send delivered", func() bool { return len(fake.Sent()) == 1 })
	if err := poll(ctx, row(held[0].ID)+` === null && document.querySelectorAll('#discord-held .item.held').length === 1`); err != nil {
		t.Fatalf("after the release: %v\n%s", err, eval[string](t, ctx, `document.getElementById('discord-held').innerText`))
	}
	if err := poll(ctx, `(`+row(held[1].ID)+`.querySelector('button[data-decide="drop"]').click(), true)`); err != nil {
		t.Fatal(err)
	}
	if err := poll(ctx, `document.getElementById('discord-held').innerText.includes('nothing is held') && document.getElementById('held-badge').hidden`); err != nil {
		t.Fatalf("after the drop: %v\n%s", err, eval[string](t, ctx, `document.getElementById('discord-held').innerText`))
	}
	var sent store.Record
	c.eventually(t, "the release's receipt", func() bool {
		for _, r := range c.records(t) {
			if r.Kind == "discord.sent" && r.Lane == store.LaneSpeech {
				sent = r
				return true
			}
		}
		return false
	})
	if !strings.Contains(string(sent.Content), `"released_by":"the operator (browser): from the browser"`) || !strings.Contains(string(sent.Content), fake.Sent()[0].ID) {
		t.Fatalf("the receipt does not name the release: %s", sent.Content)
	}
	if s := fake.Sent(); len(s) != 1 || s[0].Content != "the password is in the vault" {
		t.Fatalf("Discord got %+v, want the released send once", s)
	}
	var dropped string
	for _, r := range c.records(t) {
		if r.Kind == "discord.dropped" {
			dropped = string(r.Content)
		}
	}
	if !strings.Contains(dropped, fmt.Sprintf(`"effect_id":%d`, held[1].ID)) || !strings.Contains(dropped, "the operator (browser)") {
		t.Fatalf("the drop's notice: %q", dropped)
	}
	if _, err := c.ctl.Release(t.Context(), held[0].ID, ""); err == nil || !strings.Contains(err.Error(), "not held") {
		t.Fatalf("a second release: %v", err)
	}
	if st, _ := c.ctl.Status(t.Context()); st.Held != 0 || st.HeldSince != nil {
		t.Fatalf("status still says %d held since %v", st.Held, st.HeldSince)
	}
	if m := scrape(t, c.url); !strings.Contains(m, "\nklbr_outbox_held_waiting_seconds 0\n") {
		t.Fatal("/metrics still shows a held send waiting")
	}
}

// scrape reads klbr-core's /metrics.
func scrape(t *testing.T, base string) string {
	t.Helper()
	res, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
