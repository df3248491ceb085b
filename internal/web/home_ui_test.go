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
