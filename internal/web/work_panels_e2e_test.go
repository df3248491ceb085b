package web

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	"github.com/klbr-dev/klbr/internal/modeltest"
)

// The work panels against a real klbr-core and the scripted model: a job
// the agent starts from a cell shows in the Jobs panel with its state and
// output once it ends, and a published release's diff against the active
// one shows before it is activated.
func TestBrowserJobsAndReleaseDiff(t *testing.T) {
	model := modeltest.New()
	defer model.Close()
	model.Then(modeltest.Reply{Calls: []modeltest.Call{{ID: "c1",
		Code: "j = await jobs.run(['sh', '-c', 'echo built the thing'])\nawait runtime.wait(None, reason='the build runs')"}}})
	model.Otherwise(func(int) modeltest.Reply {
		return modeltest.Reply{Calls: []modeltest.Call{{Code: "await runtime.wait(None)"}}}
	})
	c := startCore(t, model)

	// A candidate: the active release's tree with another soul.
	rels, err := c.ctl.Releases(t.Context())
	if err != nil || len(rels.Sessions) == 0 || rels.Sessions[0].Release == "" {
		t.Fatalf("releases: %+v %v", rels, err)
	}
	active := rels.Sessions[0].Release
	tree := filepath.Join(t.TempDir(), "tree")
	if err := os.CopyFS(tree, os.DirFS(filepath.Join(c.data, "releases", active, "tree"))); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tree, "soul.md"), []byte("You are a candidate soul.\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cand, err := c.ctl.Publish(t.Context(), tree)
	if err != nil {
		t.Fatal(err)
	}

	ctx := browserCtx(t)
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	openAndSend(t, ctx, c, "build it")
	// The job ends and wakes the agent; the panel shows it succeeded, with
	// its output.
	if err := chromedp.Do(ctx, chromedp.Poll[chromedp.Void](`document.querySelector('#jobs details.job[data-state="succeeded"]') !== null`,
		chromedp.WithPollingTimeout(60*time.Second))); err != nil {
		t.Fatalf("the job in the panel: %v\n%s", err, eval[string](t, ctx, `document.querySelector('#jobs').innerText`))
	}
	job := eval[map[string]any](t, ctx, `(() => { const d = document.querySelector('#jobs details.job'); d.open = true;
		return {head: d.querySelector('summary').textContent, output: (d.querySelector('.job-output') || {}).textContent || '',
		  link: (d.querySelector('a') || {href: ''}).href}; })()`)
	if head := job["head"].(string); !strings.Contains(head, "job 1") || !strings.Contains(head, "succeeded") || !strings.Contains(head, "sh -c echo built the thing") {
		t.Errorf("the job's line: %q", head)
	}
	if !strings.Contains(job["output"].(string), "built the thing") || !strings.Contains(job["link"].(string), "/v2/artifacts/") {
		t.Errorf("the job's output %q, link %q", job["output"], job["link"])
	}
	// The job's end is the host's input, not the operator's.
	if who := eval[string](t, ctx, `[...document.querySelectorAll('#conv .entry.in .who')].map(e => e.textContent).join('|')`); !strings.Contains(who, "klbr · job") ||
		strings.Count(who, "you ·") != 1 {
		t.Errorf("the inputs' authors: %q, want the operator once and the job's end as klbr's", who)
	}
	eval[bool](t, ctx, `document.querySelector('#p-jobs').open = true`)
	screenshot(t, ctx, "panels-jobs")

	// The candidate's diff against the active release, before activating it.
	if err := chromedp.Do(ctx,
		chromedp.Click(chromedp.CSS(`#diff-release`)),
		chromedp.SendKeys(chromedp.CSS(`#diff-release`), cand.ID+kb.Enter),
	); err != nil {
		t.Fatal(err)
	}
	if err := poll(ctx, `document.querySelector('#release-diff pre.diff') !== null`); err != nil {
		t.Fatalf("the diff: %v\n%s", err, eval[string](t, ctx, `document.querySelector('#release-diff').innerText`))
	}
	diff := eval[map[string]any](t, ctx, `({add: [...document.querySelectorAll('#release-diff .d-add')].map(e => e.textContent).join(''),
		files: [...document.querySelectorAll('#release-diff .d-file')].map(e => e.textContent).join('')})`)
	if !strings.Contains(diff["add"].(string), "+You are a candidate soul.") || !strings.Contains(diff["files"].(string), "b/soul.md") {
		t.Errorf("the diff: %v", diff)
	}
	screenshot(t, ctx, "panels-release-diff")

	// The endpoint refuses what is not a release id (never a path).
	for _, bad := range []string{"../../etc", active[:12]} {
		eval[bool](t, ctx, `document.querySelector('#release-diff').replaceChildren(), showDiff(`+jsString(active)+`, `+jsString(bad)+`), true`)
		if err := poll(ctx, `document.querySelector('#release-diff').innerText.includes('no diff: ')`); err != nil {
			t.Errorf("a diff to %q: %s", bad, eval[string](t, ctx, `document.querySelector('#release-diff').innerText`))
		}
	}
}

func jsString(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s) + "'"
}
