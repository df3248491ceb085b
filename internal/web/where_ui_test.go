package web

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/klbr-dev/klbr/internal/store"
)

// The jobs and children panels say where each thing runs: a job sent to a
// worker host names it, a job asking for a label names the label until it
// is placed, a local job says here; a child working on a host names it.
func TestBrowserPanelsSayWhere(t *testing.T) {
	h := start(t)
	if err := h.st.Write(t.Context(), func(tx *store.Tx) error {
		local, err := tx.InsertJob(store.NewJob{Kind: "command", Session: "default", Spec: json.RawMessage(`{"argv":["make","local"]}`), Recovery: "manual"})
		if err != nil {
			return err
		}
		if _, err := tx.StartJob(local); err != nil {
			return err
		}
		remote, err := tx.InsertJob(store.NewJob{Kind: "command", Session: "default", Spec: json.RawMessage(`{"argv":["make","there"],"host":"label:gpu"}`), Recovery: "manual"})
		if err != nil {
			return err
		}
		if _, err := tx.StartJob(remote); err != nil {
			return err
		}
		if err := tx.PlaceJob(remote, "gpu1"); err != nil {
			return err
		}
		if _, err := tx.InsertJob(store.NewJob{Kind: "command", Session: "default", Spec: json.RawMessage(`{"argv":["make","later"],"host":"label:big"}`), Recovery: "manual"}); err != nil {
			return err
		}
		if _, err := tx.SpawnChild(store.NewChild{Parent: "default", Task: "work on the box",
			Workspace: &store.ChildWorkspace{Mode: "worktree", Kind: "copy", Host: "gpu1", Dir: "/var/tmp/klbr/klbr-ws-default-abcdef", Root: "/srv/proj"}}); err != nil {
			return err
		}
		_, err = tx.SpawnChild(store.NewChild{Parent: "default", Task: "work locally"})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	ctx := browserCtx(t)
	if err := chromedp.Do(ctx,
		chromedp.Navigate(h.http.URL+"/?token="+testToken),
		chromedp.WaitVisible(chromedp.CSS(`#h-conn[data-state="live"]`)),
	); err != nil {
		t.Fatal(err)
	}
	if err := poll(ctx, `document.querySelectorAll('#jobs details.job').length === 5 && document.querySelectorAll('#children .child').length === 2`); err != nil {
		t.Fatalf("the panels: %v\njobs: %s\nchildren: %s", err, eval[string](t, ctx, `document.querySelector('#jobs').innerText`),
			eval[string](t, ctx, `document.querySelector('#children').innerText`))
	}
	// (The children's own jobs are the session's jobs too: five in all.)
	jobs := eval[map[string]string](t, ctx, `Object.fromEntries([...document.querySelectorAll('#jobs details.job')].map(d =>
		[d.querySelector('.job-title').textContent, d.querySelector('summary').textContent]))`)
	for title, want := range map[string]string{"command · make local": "here", "command · make there": "on gpu1", "command · make later": "on label:big"} {
		if !strings.Contains(jobs[title], want) {
			t.Errorf("the job %q reads %q, want %q in it (all: %v)", title, jobs[title], want, jobs)
		}
	}
	kids := eval[map[string]string](t, ctx, `Object.fromEntries([...document.querySelectorAll('#children .child')].map(d =>
		[d.querySelector('.child-task').textContent, d.innerText]))`)
	if !strings.Contains(kids["work on the box"], "host gpu1") || !strings.Contains(kids["work locally"], "where\nhere") || strings.Contains(kids["work locally"], "host ") {
		t.Errorf("the children do not say where they work: %v", kids)
	}
	eval[bool](t, ctx, `document.querySelector('#p-jobs').open = true, document.querySelector('#p-children').open = true, true`)
	screenshot(t, ctx, "panels-where")
}
