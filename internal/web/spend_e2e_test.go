package web

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/klbr-dev/klbr/internal/modeltest"
)

// The spend panel against a real klbr-core and a scripted model that
// reports each request's cost: a daily cap reached mid-session shows the
// held session's state ("spend cap: daily_usd, resets …") in the panel and
// the header, today's spend against the cap and what the route and the
// purpose spent; raising the cap from the panel (the operator API's
// klbr-core spend cap, over the page's authenticated socket) resumes the
// session at once.
func TestBrowserSpendPanelRaisesACap(t *testing.T) {
	model := modeltest.New()
	defer model.Close()
	cost := func(n int) modeltest.Reply {
		return modeltest.Reply{Usage: map[string]any{"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120, "cost": 0.03},
			Calls: []modeltest.Call{{ID: fmt.Sprintf("c%d", n), Code: fmt.Sprintf("print(%d)", n)}}}
	}
	model.Then(cost(1), cost(2)) // $0.06 of $0.05: the next request waits
	model.Otherwise(func(n int) modeltest.Reply {
		r := cost(n)
		r.Calls[0].Code = "await runtime.wait(None)"
		return r
	})
	c := startCoreConf(t, fmt.Sprintf("[agent]\nroute = \"main\"\nretry_backoff_ms = 50\n\n[spend]\ndaily_usd = 0.05\ntime_zone = \"UTC\"\n\n"+
		"[routes.main]\nurl = %q\nmodel = \"fake\"\ntimeout_seconds = 60\n", model.URL()))
	ctx := browserCtx(t)
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	openAndSend(t, ctx, c, "count")

	now := time.Now().UTC()
	resets := "spend cap: daily_usd, resets " + time.Date(now.Year(), now.Month(), now.Day()+1, 0, 0, 0, 0, time.UTC).Format("2006-01-02 15:04 MST")
	if err := chromedp.Do(ctx, chromedp.Poll[chromedp.Void](`(refreshSpend(), (() => { const h = document.querySelector('#spend .spend-held');
		return h !== null && h.dataset.session === 'default' && document.querySelector('#p-spend').open; })())`,
		chromedp.WithPollingTimeout(60*time.Second), chromedp.WithPollingInterval(300*time.Millisecond))); err != nil {
		t.Fatalf("the held session in the panel: %v\n%s", err, eval[string](t, ctx, `document.querySelector('#spend').innerText`))
	}
	got := eval[map[string]any](t, ctx, `({held: document.querySelector('#spend .spend-held').textContent,
		badge: document.querySelector('#spend-badge').hidden ? '' : document.querySelector('#spend-badge').textContent,
		today: document.querySelector('#spend .spend-period').innerText,
		route: document.querySelector('#spend [data-period="today"] tr[data-key="main"]').innerText,
		purpose: document.querySelector('#spend [data-period="today"] .spend-groups:nth-child(2) tr[data-key="turn"]').innerText,
		month: document.querySelector('#spend [data-period="month"] tr[data-key="main"]').innerText})`)
	if held := got["held"].(string); !strings.Contains(held, "default: "+resets) {
		t.Errorf("the held line %q, want %q", held, resets)
	}
	if got["badge"] != "cap reached" {
		t.Errorf("the panel's badge: %q", got["badge"])
	}
	for k, want := range map[string]string{"today": "$0.0600 of $0.0500 (120 %)", "route": "$0.0600", "purpose": "$0.0600", "month": "$0.0600"} {
		if s := got[k].(string); !strings.Contains(s, want) {
			t.Errorf("%s: %q lacks %q", k, s, want)
		}
	}
	if !strings.Contains(got["route"].(string), "2") || !strings.Contains(got["route"].(string), "240") {
		t.Errorf("today's route row %q: want 2 requests, 240 tokens", got["route"])
	}
	if err := poll(ctx, `document.querySelector('#h-reason').textContent.includes(`+jsString(resets)+`)`); err != nil {
		t.Errorf("the header: %q, want %q", eval[string](t, ctx, `document.querySelector('#h-reason').textContent`), resets)
	}
	if err := poll(ctx, `(() => { const b = document.querySelector('#banner .banner-line[data-kind="spend-cap"]');
		return b !== null && b.textContent.includes(`+jsString(resets)+`) && b.textContent.includes('resumes by itself'); })()`); err != nil {
		t.Errorf("the banner: %q", eval[string](t, ctx, `document.querySelector('#banner').innerText`))
	}
	eval[bool](t, ctx, `document.querySelector('#p-spend').scrollIntoView(), true`)
	screenshot(t, ctx, "panels-spend-held")
	if n := model.Count(); n != 2 {
		t.Fatalf("%d model requests at the cap, want 2", n)
	}

	// Raise the daily cap from the panel: the session resumes at once.
	eval[bool](t, ctx, `window.confirm = () => true; document.querySelector('#spend-cap-name').value = 'daily';
		document.querySelector('#spend-cap-usd').value = '1.50'; true`)
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`#spend-cap-form button[type="submit"]`))); err != nil {
		t.Fatal(err)
	}
	c.eventually(t, "the session resumes after the cap was raised", func() bool { return model.Count() >= 3 })
	if err := poll(ctx, `document.querySelector('#controls-status').textContent.includes('spend_cap: the daily spend cap is now 1.50 USD')`); err != nil {
		t.Errorf("the control's answer: %q", eval[string](t, ctx, `document.querySelector('#controls-status').textContent`))
	}
	if err := chromedp.Do(ctx, chromedp.Poll[chromedp.Void](`(refreshSpend(), document.querySelector('#spend .spend-held') === null &&
		document.querySelector('#spend .spend-period').innerText.includes('of $1.50'))`,
		chromedp.WithPollingTimeout(20*time.Second), chromedp.WithPollingInterval(300*time.Millisecond))); err != nil {
		t.Errorf("the panel after the raise: %v\n%s", err, eval[string](t, ctx, `document.querySelector('#spend').innerText`))
	}
	// The cap is the operator's, kept in the store: the operator API reads it.
	sp, err := c.ctl.Spend(t.Context(), "route", time.Time{})
	if err != nil || sp.State == nil || sp.State.DailyUSD == nil || *sp.State.DailyUSD != 1.5 {
		t.Fatalf("the operator API's spend after the raise: %+v, %v", sp.State, err)
	}
	screenshot(t, ctx, "panels-spend-raised")

	// A cap the socket brings out of bounds is refused before it reaches the daemon.
	eval[bool](t, ctx, `sendControl({type: 'spend_cap', cap: 'weekly', usd: 1}), true`)
	if err := poll(ctx, `document.querySelector('#composer-status').textContent.includes('cap must be daily or monthly')`); err != nil {
		t.Errorf("a weekly cap: %q", eval[string](t, ctx, `document.querySelector('#composer-status').textContent`))
	}
}
