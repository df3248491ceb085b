package web

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/klbr-dev/klbr/internal/modeltest"
)

// The children panel against a real klbr-core and the scripted model: a
// child the agent spawns shows under its parent with its state, its job's
// state, its budget, what it used and its result; its name opens its own
// page, whose lanes read like any session's.
func TestBrowserChildUnderItsParent(t *testing.T) {
	model := modeltest.New()
	defer model.Close()
	goFile := filepath.Join(t.TempDir(), "go")
	model.Then(
		modeltest.Reply{Calls: []modeltest.Call{{ID: "r1", Code: "child = await agents.spawn(task='count the widgets', budget={'tokens': 5000})\n" +
			"await runtime.wait(None, reason=f'child {child.id}')"}}},
		modeltest.Reply{Calls: []modeltest.Call{{ID: "k1", Code: "import asyncio, os\nprint('CHILD WORKING', flush=True)\n" +
			"while not os.path.exists(" + jsString(goFile) + "):\n    await asyncio.sleep(0.05)"}}},
		modeltest.Reply{Calls: []modeltest.Call{{ID: "k2", Code: "await agents.finish({'widgets': 3})"}}},
	)
	model.Otherwise(func(int) modeltest.Reply {
		return modeltest.Reply{Text: "The child counted.", Calls: []modeltest.Call{{Code: "await runtime.wait(None)"}}}
	})
	c := startCore(t, model)
	ctx := browserCtx(t)
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	openAndSend(t, ctx, c, "delegate the widget count")
	// While its cell runs, it shows running, with what it used so far.
	if err := chromedp.Do(ctx, chromedp.Poll[chromedp.Void](`(() => { const d = document.querySelector('#children .child[data-job-state="running"]');
		return d !== null && d.dataset.state === 'running' && d.innerText.includes('1 model request') && d.innerText.includes('so far'); })()`,
		chromedp.WithPollingTimeout(60*time.Second))); err != nil {
		t.Fatalf("the running child in the panel: %v\n%s", err, eval[string](t, ctx, `document.querySelector('#children').innerText`))
	}
	if err := os.WriteFile(goFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(ctx, chromedp.Poll[chromedp.Void](`document.querySelector('#children .child[data-job-state="succeeded"]') !== null`,
		chromedp.WithPollingTimeout(60*time.Second))); err != nil {
		t.Fatalf("the child in the panel: %v\n%s", err, eval[string](t, ctx, `document.querySelector('#children').innerText`))
	}
	got := eval[map[string]any](t, ctx, `(() => { const d = document.querySelector('#children .child');
		return {session: d.dataset.session, open: document.querySelector('#p-children').open, text: d.innerText,
		  result: (d.querySelector('.child-result') || {}).textContent || '', href: d.querySelector('a.child-link').getAttribute('href')}; })()`)
	text := got["text"].(string)
	for _, want := range []string{"child-1", "succeeded", "count the widgets", `{"tokens":5000}`, "2 model requests", "tokens ·", "wall"} {
		if !strings.Contains(text, want) {
			t.Errorf("the child's entry lacks %q:\n%s", want, text)
		}
	}
	if got["session"] != "child-1" || got["result"] != `{"widgets":3}` || got["open"] != true || got["href"] != "/?session=child-1" {
		t.Errorf("the child's entry %v", got)
	}
	screenshot(t, ctx, "panels-children")

	// Its name opens its own page: its task is its first input, its cell in
	// its cell lane.
	if err := chromedp.Do(ctx,
		chromedp.Click(chromedp.CSS(`#children a.child-link`)),
		chromedp.WaitVisible(chromedp.CSS(`#h-conn[data-state="live"]`)),
	); err != nil {
		t.Fatal(err)
	}
	if err := poll(ctx, `document.querySelector('#h-session').textContent === 'child-1' && document.querySelector('#conv').innerText.includes('count the widgets')`); err != nil {
		t.Fatalf("the child's page: %v\n%s", err, eval[string](t, ctx, `document.querySelector('#h-session').textContent + ' ' + document.querySelector('#conv').innerText`))
	}
	if err := poll(ctx, `(document.querySelector('#children .child-parent a') || {}).textContent === 'default'`); err != nil {
		t.Errorf("the child's page does not name its parent: %s", eval[string](t, ctx, `document.querySelector('#children').innerText`))
	}
	// Its header names its parent too, and, the child having finished, its
	// message box does not invite messages nobody will read.
	if err := poll(ctx, `(() => { const f = document.querySelector('#f-parent'), a = document.querySelector('#h-parent');
		return f && !f.hidden && a.textContent === 'default' && a.getAttribute('href') === '/?session=default'; })()`); err != nil {
		t.Errorf("the child's header does not name its parent: %v", err)
	}
	if err := poll(ctx, `(() => { const c = document.querySelector('#composer');
		return c.disabled && c.placeholder.includes('finished') && c.placeholder.includes('default'); })()`); err != nil {
		t.Errorf("a finished child's message box still invites messages: %q", eval[string](t, ctx, `document.querySelector('#composer').placeholder`))
	}
	eval[bool](t, ctx, `setView('lanes'), true`)
	if err := poll(ctx, `document.querySelector('#lane-cell').innerText.includes('CHILD WORKING')`); err != nil {
		t.Fatalf("the child's cell lane: %v\n%s", err, eval[string](t, ctx, `document.querySelector('#lane-cell').innerText`))
	}
	screenshot(t, ctx, "child-lanes")
}

// The operator cancels a running child from the panel (it asks first): the
// child ends cancelled, as with klbr-core jobs cancel, the answer says so,
// and its entry loses its Cancel button.
func TestBrowserCancelsAChild(t *testing.T) {
	model := modeltest.New()
	defer model.Close()
	model.Then(
		modeltest.Reply{Calls: []modeltest.Call{{ID: "r1", Code: "child = await agents.spawn(task='loop for ever')\n" +
			"await runtime.wait(None, reason=f'child {child.id}')"}}},
		modeltest.Reply{Calls: []modeltest.Call{{ID: "k1", Code: "import asyncio\nprint('CHILD LOOPING', flush=True)\n" +
			"while True:\n    await asyncio.sleep(0.05)"}}},
	)
	model.Otherwise(func(int) modeltest.Reply {
		return modeltest.Reply{Text: "The child was cancelled.", Calls: []modeltest.Call{{Code: "await runtime.wait(None)"}}}
	})
	c := startCore(t, model)
	ctx := browserCtx(t)
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	openAndSend(t, ctx, c, "start a child that never ends")
	if err := chromedp.Do(ctx, chromedp.Poll[chromedp.Void](`document.querySelector('#children .child[data-job-state="running"] button.child-cancel') !== null`,
		chromedp.WithPollingTimeout(60*time.Second))); err != nil {
		t.Fatalf("no Cancel on the running child: %v\n%s", err, eval[string](t, ctx, `document.querySelector('#children').innerText`))
	}
	eval[bool](t, ctx, `window.confirm = () => true; true`)
	if err := poll(ctx, `(b => !!b && (b.click(), true))(document.querySelector('#children button.child-cancel'))`); err != nil {
		t.Fatal(err)
	}
	if err := poll(ctx, `document.querySelector('#controls-status').textContent.includes('job_cancel: job 1 is cancelled')`); err != nil {
		t.Fatalf("the cancel's answer: %v: %s", err, eval[string](t, ctx, `document.querySelector('#controls-status').textContent`))
	}
	if err := chromedp.Do(ctx, chromedp.Poll[chromedp.Void](`(d => d !== null && d.querySelector('button.child-cancel') === null)(document.querySelector('#children .child[data-job-state="cancelled"]'))`,
		chromedp.WithPollingTimeout(60*time.Second))); err != nil {
		t.Fatalf("the cancelled child in the panel: %v\n%s", err, eval[string](t, ctx, `document.querySelector('#children').innerText`))
	}
	// A second cancel of the ended job is refused, not repeated.
	eval[bool](t, ctx, `ws.send(JSON.stringify({type: "job_cancel", job: 1})), true`)
	if err := poll(ctx, `document.querySelector('#controls-status').textContent.startsWith('job_cancel: conflict')`); err != nil {
		t.Errorf("a second cancel: %v: %s", err, eval[string](t, ctx, `document.querySelector('#controls-status').textContent`))
	}
}
