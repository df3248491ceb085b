package web

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	"github.com/klbr-dev/klbr/internal/modeltest"
)

// convText is the conversation's entries as the page renders them: type and
// text, in order.
const convEntries = `[...document.querySelectorAll('#conv .entry')].map(e => (e.classList.contains('work') ? 'work' :
	e.classList.contains('in') ? 'in' : e.classList.contains('out') ? 'out:' + [...e.classList].find(c => c.startsWith('st-')) : 'other') +
	'|' + e.innerText.replace(/\s+/g, ' ').slice(0, 160))`

// openAndSend opens the page signed in to c, waits for its live stream and
// sends text from the composer as the operator types it.
func openAndSend(t *testing.T, ctx context.Context, c *core, text string) {
	t.Helper()
	if err := chromedp.Do(ctx,
		chromedp.Navigate(c.url+"/?token="+c.token),
		chromedp.WaitVisible(chromedp.CSS(`#h-conn[data-state="live"]`)),
		chromedp.Click(chromedp.CSS(`#composer`)),
		chromedp.SendKeys(chromedp.CSS(`#composer`), text+kb.Enter),
	); err != nil {
		t.Fatal(err)
	}
}

// The conversation view against a real klbr-core and the scripted model: a
// dialogue reads in order, the agent's work (scratchpad with Markdown,
// reasoning, cells with code and output) sits between the messages
// collapsed and opens on a click or Enter; a delivered and a held send are
// distinct cards; Markdown renders safely; v switches to the lanes and back.
func TestBrowserConversation(t *testing.T) {
	model := modeltest.New()
	defer model.Close()
	md := "**Plan**: compute `x` first.\n\n```python\nx = 6 * 7\n```\n\n- check it\n- tell them: [docs](https://example.com/a) " +
		"[bad](javascript:alert(1)) <img src=x onerror=alert(1)>"
	model.Then(
		modeltest.Reply{Text: md, Reasoning: "Six sevens.", Calls: []modeltest.Call{{ID: "c1", Code: "x = 6 * 7\nprint('row\\n' * 30)\nx"}}},
		modeltest.Reply{Text: "Now I tell them, then wait.", Calls: []modeltest.Call{{ID: "c2",
			Code: "await local.send(f'The answer is **{x}**.')\nawait local.send('   ')\nawait runtime.wait(None, reason='the operator may follow up')"}}},
	)
	c := startCore(t, model)
	ctx := browserCtx(t)
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	openAndSend(t, ctx, c, "what is six times seven?")
	if err := poll(ctx, `document.querySelector('#h-state').textContent === 'waiting' &&
		document.querySelectorAll('#conv .entry.out').length === 2`); err != nil {
		t.Fatalf("the exchange: %v\n%s", err, eval[string](t, ctx, `document.querySelector('#conv').innerText`))
	}
	if eval[bool](t, ctx, `!document.getElementById('lanes').hidden`) {
		t.Error("the lanes show by default; the conversation should")
	}
	entries := eval[[]string](t, ctx, convEntries)
	// Notices of the start (the kernel, the release) come before the message.
	for len(entries) > 0 && !strings.HasPrefix(entries[0], "in|") {
		if !strings.Contains(strings.ToLower(entries[0]), "notice") {
			t.Errorf("before the message: %q, want only the start's notices", entries[0])
		}
		entries = entries[1:]
	}
	kinds := []string{}
	for _, e := range entries {
		kinds = append(kinds, strings.SplitN(e, "|", 2)[0])
	}
	// In order: the message, the work before the answer, the answer, the held
	// send, then the work that followed (the wait).
	want := []string{"in", "work", "out:st-sent", "out:st-held", "work"}
	if strings.Join(kinds, " ") != strings.Join(want, " ") {
		t.Fatalf("entries %v, want %v:\n%s", kinds, want, strings.Join(entries, "\n"))
	}
	if !strings.Contains(entries[0], "what is six times seven?") || !strings.Contains(entries[2], "The answer is 42.") ||
		!strings.Contains(entries[3], "held") {
		t.Errorf("entries:\n%s", strings.Join(entries, "\n"))
	}
	// The work is collapsed: a summary, not the records.
	if n := eval[float64](t, ctx, `document.querySelectorAll('#conv .work-body').length`); n != 0 {
		t.Errorf("%v work blocks open by default", n)
	}
	if !strings.Contains(entries[1], "2 steps") || !strings.Contains(entries[1], "cell") {
		t.Errorf("the work summary: %q", entries[1])
	}
	// Speech renders Markdown; the held card says why, distinct from the sent one.
	if n := eval[float64](t, ctx, `document.querySelectorAll('#conv .entry.out.st-sent strong').length`); n != 1 {
		t.Errorf("the answer's **42** is not bold (%v strong)", n)
	}
	held := eval[string](t, ctx, `document.querySelector('#conv .entry.out.st-held').innerText`)
	if !strings.Contains(held, "held by review") {
		t.Errorf("held card: %q", held)
	}
	if eval[string](t, ctx, `getComputedStyle(document.querySelector('#conv .st-held .bubble')).borderTopStyle`) != "dashed" {
		t.Error("the held card is not drawn apart from delivered speech")
	}
	screenshot(t, ctx, "home-1-conversation")

	// A click opens the first work block: scratchpad (Markdown), reasoning
	// (collapsed), the cell's code and its output (long output folded).
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`#conv .entry.work:not(.notices-only) .work-head`))); err != nil {
		t.Fatal(err)
	}
	if err := poll(ctx, `document.querySelector('#conv .entry.work:not(.notices-only) .work-body') !== null`); err != nil {
		t.Fatal(err)
	}
	work := eval[map[string]any](t, ctx, `(() => { const w = document.querySelector('#conv .entry.work:not(.notices-only) .work-body');
		return {scratch: w.querySelectorAll('.record.scratch').length, cells: w.querySelectorAll('.record.cell').length,
		  reasoning: w.querySelector('details.reasoning') !== null && !w.querySelector('details.reasoning').open,
		  strong: w.querySelectorAll('.record.scratch strong').length, code: w.querySelectorAll('.record.scratch pre.md-code .kw, .record.scratch pre.md-code .num').length,
		  list: w.querySelectorAll('.record.scratch li').length,
		  links: [...w.querySelectorAll('.record.scratch a')].map(a => a.getAttribute('href')),
		  img: w.querySelectorAll('img').length, output: w.querySelector('.record.cell details.long') !== null,
		  ok: w.querySelectorAll('.record.cell .outcome.ok').length, text: w.innerText}; })()`)
	// Both steps ran before the first send: one block, two steps, two cells
	// (the second, which spoke and waits, is yielded).
	if work["scratch"] != 2.0 || work["cells"] != 2.0 || work["reasoning"] != true || work["strong"] != 1.0 || work["code"] == 0.0 ||
		work["list"] != 2.0 || work["img"] != 0.0 || work["output"] != true || work["ok"] != 1.0 {
		t.Errorf("the opened work: %v", work)
	}
	if links, _ := work["links"].([]any); len(links) != 1 || links[0] != "https://example.com/a" {
		t.Errorf("links %v: want only the https one (javascript: stays text)", work["links"])
	}
	if !strings.Contains(work["text"].(string), "<img src=x onerror=alert(1)>") || !strings.Contains(work["text"].(string), "x = 6 * 7") {
		t.Errorf("raw HTML should show as text, the code should show: %q", work["text"])
	}
	screenshot(t, ctx, "home-2-work-open")

	// Keyboard: j/k move between entries, Enter closes the block again.
	if err := chromedp.Do(ctx,
		chromedp.Poll[chromedp.Void](`(document.activeElement.blur(), true)`),
		chromedp.KeyEvent("k"), chromedp.KeyEvent("k"), chromedp.KeyEvent("k"), chromedp.KeyEvent("k"),
	); err != nil {
		t.Fatal(err)
	}
	if got := eval[string](t, ctx, `document.activeElement.getAttribute('aria-label') || ''`); !strings.Contains(got, "agent work") {
		t.Errorf("after k×4 the focus is on %q, want the first work block", got)
	}
	if err := chromedp.Do(ctx, chromedp.KeyEvent(kb.Enter)); err != nil {
		t.Fatal(err)
	}
	if err := poll(ctx, `document.querySelector('#conv .work-body') === null`); err != nil {
		t.Errorf("Enter did not close the work block: %v", err)
	}
	// v: the five lanes, with every record in its lane; v again: back.
	if err := chromedp.Do(ctx, chromedp.KeyEvent("v")); err != nil {
		t.Fatal(err)
	}
	if err := poll(ctx, `!document.getElementById('lanes').hidden && document.getElementById('conv').hidden &&
		document.querySelectorAll('#lane-speech .record').length === 2 && document.querySelectorAll('#lane-cell .record').length === 2`); err != nil {
		t.Fatalf("v did not show the lanes: %v", err)
	}
	screenshot(t, ctx, "home-3-lanes")
	if err := chromedp.Do(ctx, chromedp.KeyEvent("v")); err != nil {
		t.Fatal(err)
	}
	if err := poll(ctx, `document.getElementById('lanes').hidden && document.querySelectorAll('#conv .entry.out').length === 2`); err != nil {
		t.Fatalf("v did not return to the conversation: %v", err)
	}

	// Input to echo: from Enter to the message's entry in the conversation.
	echo, err := chromedp.Run(ctx, chromedp.Evaluate[float64](`new Promise((resolve) => {
		const box = document.getElementById('composer');
		box.value = 'echo probe';
		const t0 = performance.now();
		const obs = new MutationObserver(() => {
			if ([...document.querySelectorAll('#conv .entry.in')].some(e => e.innerText.includes('echo probe'))) { obs.disconnect(); resolve(performance.now() - t0); }
		});
		obs.observe(document.getElementById('conv'), {childList: true, subtree: true});
		box.dispatchEvent(new KeyboardEvent('keydown', {key: 'Enter', bubbles: true}));
	})`, chromedp.EvalAwaitPromise))
	if err != nil {
		t.Fatalf("echo: %v", err)
	}
	t.Logf("input to echo: %.1f ms", echo)
}

// The banner says in words why no one answers: a klbr-core whose agent
// names routes that are not defined (a fallback named, so the seed defaults
// do not apply); then a paused session, with the Start that undoes it.
func TestBrowserBanners(t *testing.T) {
	c := startCoreConf(t, "[agent]\nroute = \"main\"\nfallback = [\"spare\"]\n")
	ctx := browserCtx(t)
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := chromedp.Do(ctx,
		chromedp.Navigate(c.url+"/?token="+c.token),
		chromedp.WaitVisible(chromedp.CSS(`#h-conn[data-state="live"]`)),
	); err != nil {
		t.Fatal(err)
	}
	if err := poll(ctx, `document.querySelector('#banner [data-kind="no-route"]') !== null`); err != nil {
		t.Fatalf("no banner without a route: %v\n%s", err, eval[string](t, ctx, `document.body.innerText`))
	}
	text := eval[string](t, ctx, `document.getElementById('banner').innerText`)
	if !strings.Contains(text, "No one will answer") || !strings.Contains(text, "no [routes.main]") || !strings.Contains(text, "kept") {
		t.Errorf("banner: %q", text)
	}
	if p := eval[string](t, ctx, `document.getElementById('composer').placeholder`); !strings.Contains(p, "not running") {
		t.Errorf("the message box does not say no one answers: %q", p)
	}
	screenshot(t, ctx, "home-4-banner-no-route")

	// Pause: the banner says so, with the control that undoes it.
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`#btn-session-pause`))); err != nil {
		t.Fatal(err)
	}
	if err := poll(ctx, `document.querySelector('#banner [data-kind="session-paused"] button') !== null`); err != nil {
		t.Fatalf("no paused banner: %v\n%s", err, eval[string](t, ctx, `document.getElementById('banner').innerText`))
	}
	if s := eval[string](t, ctx, `document.querySelector('#banner [data-kind="session-paused"]').innerText`); !strings.Contains(s, "paused by the operator") ||
		!strings.Contains(s, "Start the session") {
		t.Errorf("paused banner: %q", s)
	}
	screenshot(t, ctx, "home-5-banner-paused")
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`#banner [data-kind="session-paused"] button`))); err != nil {
		t.Fatal(err)
	}
	if err := poll(ctx, `document.querySelector('#banner [data-kind="session-paused"]') === null && document.querySelector('#h-state').textContent === 'ready'`); err != nil {
		t.Fatalf("Start did not undo the pause: %v", err)
	}
	st, err := c.ctl.Session(t.Context(), "default")
	if err != nil || st.State != "ready" {
		t.Fatalf("session after Start: %+v %v", st, err)
	}
}

// The route down and retrying, then rejecting: the banner says which, and
// when klbr tries again.
func TestBrowserRouteBanners(t *testing.T) {
	model := modeltest.New()
	defer model.Close()
	model.Otherwise(func(int) modeltest.Reply {
		return modeltest.Reply{Status: 503, Body: `{"error":{"message":"overloaded"}}`}
	})
	c := startCoreConf(t, "[agent]\nroute = \"main\"\nretry_backoff_ms = 60000\n\n[routes.main]\nurl = \""+model.URL()+"\"\nmodel = \"fake\"\n")
	ctx := browserCtx(t)
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	openAndSend(t, ctx, c, "hello?")
	if err := chromedp.Do(ctx, chromedp.Poll[chromedp.Void](`document.querySelector('#banner [data-kind="route-down"]') !== null`,
		chromedp.WithPollingTimeout(30*time.Second))); err != nil {
		t.Fatalf("no route-down banner: %v\n%s", err, eval[string](t, ctx, `document.body.innerText`))
	}
	text := eval[string](t, ctx, `document.querySelector('#banner [data-kind="route-down"]').innerText`)
	if !strings.Contains(text, "not answering") || !strings.Contains(text, "retries by itself at") {
		t.Errorf("route-down banner: %q", text)
	}
	screenshot(t, ctx, "home-6-banner-route-down")

	// A route that rejects the request: retrying will not help, and the banner says so.
	bad := modeltest.New()
	defer bad.Close()
	bad.Otherwise(func(int) modeltest.Reply {
		return modeltest.Reply{Status: 400, Body: `{"error":{"message":"model 'fake' does not exist"}}`}
	})
	c2 := startCoreConf(t, "[agent]\nroute = \"main\"\n\n[routes.main]\nurl = \""+bad.URL()+"\"\nmodel = \"fake\"\n")
	openAndSend(t, ctx, c2, "hello?")
	if err := chromedp.Do(ctx, chromedp.Poll[chromedp.Void](`document.querySelector('#banner [data-kind="rejected"]') !== null`,
		chromedp.WithPollingTimeout(30*time.Second))); err != nil {
		t.Fatalf("no rejected banner: %v\n%s", err, eval[string](t, ctx, `document.body.innerText`))
	}
	text = eval[string](t, ctx, `document.querySelector('#banner [data-kind="rejected"]').innerText`)
	if !strings.Contains(text, "rejected the request") || !strings.Contains(text, "does not exist") || !strings.Contains(text, "Retrying will not help") {
		t.Errorf("rejected banner: %q", text)
	}
	screenshot(t, ctx, "home-6b-banner-rejected")
}

// The login cookie survives a browser restart (a second Chromium on the same
// profile); klbr-core open --rotate signs that browser out, and the page
// then says how to get in.
func TestBrowserCookieSurvivesRestart(t *testing.T) {
	c := startCoreConf(t, "")
	profile := t.TempDir()
	ctx, stop := browserWith(t, profile, 1200, 800)
	if err := chromedp.Do(ctx,
		chromedp.Navigate(c.url+"/?token="+c.token),
		chromedp.WaitVisible(chromedp.CSS(`#h-conn[data-state="live"]`)),
	); err != nil {
		t.Fatal(err)
	}
	stop() // the browser closes: a session cookie would be gone
	ctx, stop = browserWith(t, profile, 1200, 800)
	if err := chromedp.Do(ctx,
		chromedp.Navigate(c.url+"/"),
		chromedp.WaitVisible(chromedp.CSS(`#h-conn[data-state="live"]`)),
	); err != nil {
		t.Fatalf("after a browser restart the page is not signed in: %v", err)
	}
	b, err := c.ctl.RotateToken(t.Context())
	if err != nil || strings.Contains(b.URL, c.token) || !strings.Contains(b.URL, "/?token=") {
		t.Fatalf("rotate: %+v %v", b, err)
	}
	// The open page loses its socket and cannot get back in.
	if err := chromedp.Do(ctx, chromedp.Poll[chromedp.Void](`document.querySelector('#h-conn').dataset.state !== 'live'`,
		chromedp.WithPollingTimeout(10*time.Second))); err != nil {
		t.Errorf("the open page stayed live after the rotation: %v", err)
	}
	if err := chromedp.Do(ctx, chromedp.Navigate(c.url+"/")); err != nil && !strings.Contains(err.Error(), "ERR_HTTP_RESPONSE_CODE_FAILURE") {
		t.Fatal(err)
	}
	if body := eval[string](t, ctx, `document.body.innerText`); !strings.Contains(body, "klbr-core open") {
		t.Errorf("after the rotation: %q, want the sign-in page", body)
	}
	// The new URL signs in again.
	if err := chromedp.Do(ctx, chromedp.Navigate(b.URL), chromedp.WaitVisible(chromedp.CSS(`#h-conn[data-state="live"]`))); err != nil {
		t.Fatalf("the rotated URL does not sign in: %v", err)
	}
	stop()
	// The old token is refused over HTTP too.
	req, _ := http.NewRequest("GET", c.url+"/v2/status", nil)
	req.Header.Set("Authorization", "Bearer "+c.token)
	if res, err := http.DefaultClient.Do(req); err != nil || res.StatusCode != 401 {
		t.Errorf("old token after rotation: %v %v", res, err)
	}
	if tok, err := os.ReadFile(filepath.Join(c.data, "operator-token")); err != nil || strings.Contains(string(tok), c.token) {
		t.Errorf("the token file still holds the old token (%v)", err)
	}
}
