package web

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"

	"github.com/klbr-dev/klbr/internal/store"
)

// Every record kind the turn loop writes, in the conversation view: speech
// cards by state (delivered, held, failed, unknown), the work blocks with a
// partial scratchpad saying so, tool calls that never ran, notices, a
// context reset as a divider; the page's labels for screen readers.
func TestBrowserConversationKinds(t *testing.T) {
	h := start(t)
	ctx := browserCtx(t)
	h.rawRecords(t, turnRecords(time.Now().Add(30*time.Second))...)
	if _, err := h.sessions.Transition(context.Background(), "default", store.StatePaused, "step budget: 40 model requests in this attempt"); err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(ctx,
		chromedp.Navigate(h.http.URL+"/?token="+testToken),
		chromedp.WaitVisible(chromedp.CSS(`#h-conn[data-state="live"]`)),
	); err != nil {
		t.Fatal(err)
	}
	if err := poll(ctx, `document.querySelector('#banner [data-kind="session-paused"]') !== null`); err != nil {
		t.Fatalf("no paused banner: %v", err)
	}
	got := eval[map[string]float64](t, ctx, `({in: document.querySelectorAll('#conv .entry.in').length,
		sent: document.querySelectorAll('#conv .entry.out.st-sent').length, held: document.querySelectorAll('#conv .entry.out.st-held').length,
		failed: document.querySelectorAll('#conv .entry.out.st-failed').length, unknown: document.querySelectorAll('#conv .entry.out.st-unknown').length,
		partial: [...document.querySelectorAll('#conv .entry.work')].filter(e => e.innerText.includes('interrupted — partial scratchpad')).length,
		divider: document.querySelectorAll('#conv .entry.divider').length,
		unlabeled: [...document.querySelectorAll('#conv .entry, button, textarea, input')].filter(e => !(e.getAttribute('aria-label') || e.textContent.trim() || e.getAttribute('placeholder'))).length})`)
	want := map[string]float64{"in": 1, "held": 0, "failed": 1, "unknown": 1, "partial": 1, "divider": 1, "unlabeled": 0}
	for k, n := range want {
		if got[k] != n {
			t.Errorf("%s: %v, want %v (all %v)", k, got[k], n, got)
		}
	}
	if got["sent"] < 2 {
		t.Errorf("%v delivered cards, want the local and the Discord one", got["sent"])
	}
	// e opens every work block: the unrun tool call and the notices are in them.
	if err := chromedp.Do(ctx, chromedp.Poll[chromedp.Void](`(document.activeElement.blur(), true)`), chromedp.KeyEvent("e")); err != nil {
		t.Fatal(err)
	}
	if err := poll(ctx, `[...document.querySelectorAll('#conv .work-body')].some(w => w.innerText.includes('not run: skipped'))`); err != nil {
		t.Errorf("the unrun tool call is not in an opened work block: %v\n%s", err, eval[string](t, ctx, `document.getElementById('conv').innerText`))
	}
	if err := poll(ctx, `[...document.querySelectorAll('#conv .work-body .record.partial')].some(w => w.innerText.includes('interrupted — partial, not sent'))`); err != nil {
		t.Errorf("the partial scratchpad does not say so: %v", err)
	}
	screenshot(t, ctx, "home-12-kinds-open")
}

// At phone width the conversation takes the screen, nothing scrolls
// sideways, the panels are a key (p) away; with reduced motion nothing
// animates.
func TestBrowserPhoneWidth(t *testing.T) {
	h := start(t)
	h.seedTurns(t, 30)
	h.rawRecords(t, turnRecords(time.Now().Add(30*time.Second))...)
	ctx, _ := browserWith(t, t.TempDir(), 390, 844)
	if err := chromedp.Do(ctx,
		chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
			_, err := cdp.Call(ctx, t, emulation.SetEmulatedMedia, emulation.SetEmulatedMediaParams{
				Features: []*emulation.MediaFeature{{Name: "prefers-reduced-motion", Value: "reduce"}}})
			return err
		}),
		chromedp.Navigate(h.http.URL+"/?token="+testToken),
		chromedp.WaitVisible(chromedp.CSS(`#h-conn[data-state="live"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#conv .entry`)),
	); err != nil {
		t.Fatal(err)
	}
	m := eval[map[string]any](t, ctx, `({wide: document.documentElement.scrollWidth, view: innerWidth,
		panels: getComputedStyle(document.getElementById('panels')).display, conv: document.getElementById('conv').clientWidth,
		controls: getComputedStyle(document.getElementById('controls')).display,
		motion: [...document.querySelectorAll('*')].some(e => getComputedStyle(e).animationName !== 'none')})`)
	if m["wide"].(float64) > m["view"].(float64) || m["panels"] != "none" || m["conv"].(float64) < 300 || m["controls"] != "none" || m["motion"] != false {
		t.Errorf("phone layout: %v (want no sideways scroll, panels and controls folded, the conversation full width, no animation)", m)
	}
	screenshot(t, ctx, "home-13-phone")
	if err := chromedp.Do(ctx, chromedp.Poll[chromedp.Void](`(document.activeElement.blur(), true)`), chromedp.KeyEvent("p")); err != nil {
		t.Fatal(err)
	}
	if err := poll(ctx, `getComputedStyle(document.getElementById('panels')).display !== 'none' && document.documentElement.scrollWidth <= innerWidth`); err != nil {
		t.Errorf("p did not show the panels at phone width: %v", err)
	}
	screenshot(t, ctx, "home-14-phone-panels")
	if s := eval[string](t, ctx, `document.getElementById('panels').innerText`); !strings.Contains(s, "JOBS") && !strings.Contains(s, "Jobs") {
		t.Errorf("panels: %q", s)
	}
}

// The Markdown renderer never lets markup through: over hostile inputs and
// thousands of random ones, the only elements it makes are its own, the
// only attributes are its own, and every link is http, https or mailto.
func TestMarkdownIsSafe(t *testing.T) {
	h := start(t)
	ctx := browserCtx(t)
	if err := chromedp.Do(ctx,
		chromedp.Navigate(h.http.URL+"/?token="+testToken),
		chromedp.WaitVisible(chromedp.CSS(`#h-conn[data-state="live"]`)),
	); err != nil {
		t.Fatal(err)
	}
	res := eval[map[string]any](t, ctx, `(() => {
		const hostile = ["<script>alert(1)</script>", "<img src=x onerror=alert(1)>", "[x](javascript:alert(1))", "[x](JaVaScRiPt:alert(1))",
			"[x]( javascript:alert(1))", "[x](data:text/html,<script>alert(1)</script>)", "[x](vbscript:msgbox)", "<a href=\"javascript:x\">y</a>",
			"`+"```"+`\n</pre><script>alert(1)</script>\n`+"```"+`", "**<b>bold</b>**", "[<img src=x>](https://ok.example)", "https://ex.example/\"><script>",
			"[a](https://x.example/\" onmouseover=\"alert(1))", "> <iframe src=//evil>", "- <svg onload=alert(1)>", "1. <style>*{}</style>",
			"`+"```"+`js\n<script>\n`+"```"+`", "[x](mailto:a@b.example)", "_<i>x</i>_", "<!-- c -->", "&lt;script&gt;"];
		const alphabet = ["*", "_", "`+"`"+`", "[", "]", "(", ")", "<", ">", "\"", "'", "#", "-", "1.", " ", "\n", "\n\n", "`+"```"+`",
			"javascript:", "https://a.example/", "mailto:x@y", "data:", "<script>", "onerror=", "&", "x", "yz", ">"];
		let seed = 7;
		const rnd = (n) => { seed = (seed * 1103515245 + 12345) & 0x7fffffff; return seed % n; };
		const inputs = hostile.slice();
		for (let i = 0; i < 3000; i++) { let s = ""; const n = 1 + rnd(40); for (let j = 0; j < n; j++) s += alphabet[rnd(alphabet.length)]; inputs.push(s); }
		const tags = new Set(["DIV", "P", "BR", "STRONG", "EM", "CODE", "PRE", "A", "UL", "OL", "LI", "BLOCKQUOTE", "SPAN"]);
		const attrs = new Set(["class", "href", "rel", "target", "start", "data-lang"]);
		const bad = [];
		let links = 0;
		for (const s of inputs) {
			const root = renderMarkdown(s);
			for (const e of [root, ...root.querySelectorAll("*")]) {
				if (!tags.has(e.tagName)) bad.push(s + " → <" + e.tagName + ">");
				for (const a of e.attributes) if (!attrs.has(a.name)) bad.push(s + " → @" + a.name);
				if (e.tagName === "A") { links++; if (!/^(https?:|mailto:)/.test(e.getAttribute("href"))) bad.push(s + " → href " + e.getAttribute("href")); }
				if (e.tagName === "SPAN" && !e.closest("pre")) bad.push(s + " → a span outside code");
			}
			// The text survives: nothing typed is lost.
			const plain = s.replace(/[*_`+"`"+`#>\s-]|\d\.|\[|\]|\(|\)/g, "");
			if (plain.includes("<script>") && !root.textContent.includes("<script>")) bad.push(s + " → the text <script> was dropped");
		}
		return {bad: bad.slice(0, 10), n: inputs.length, links};
	})()`)
	if bad, _ := res["bad"].([]any); len(bad) > 0 {
		t.Fatalf("unsafe Markdown output: %v", bad)
	}
	if res["links"].(float64) < 3 {
		t.Errorf("only %v links were made: the renderer drops safe links too", res["links"])
	}
	t.Logf("%v inputs rendered safely, %v links", res["n"], res["links"])
}
