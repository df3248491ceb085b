package daemon

import (
	"strings"
	"testing"

	"github.com/klbr-dev/klbr/internal/modeltest"
	"github.com/klbr-dev/klbr/internal/store"
)

// said returns the first message of any request that holds marker (""
// when none does).
func said(model *modeltest.Server, marker string) string {
	for _, r := range model.Requests() {
		for _, m := range r.Messages {
			if c := content(m); strings.Contains(c, marker) {
				return c
			}
		}
	}
	return ""
}

// A child granted a mixed summary (operator input and the agent's own
// steps) and the operator scope: the summary is refused whole, children
// narrows it to the operator originals, which read; its search finds the
// granted operator inputs and its own task, never the summary.
func TestChildEvidenceScopes(t *testing.T) {
	model := modeltest.New()
	defer model.Close()
	model.ToolFree(func(modeltest.Request) modeltest.Reply {
		return modeltest.Reply{Text: "Summary: the widget deploy failed at noon and the agent noted it."}
	})
	model.Then(
		modeltest.Reply{Text: "noted", Calls: []modeltest.Call{{ID: "r1", Code: "print('noted the widget', 'x' * 4000)\nawait runtime.wait(None)"}}},
		modeltest.Reply{Text: "noted again", Calls: []modeltest.Call{{ID: "r2", Code: "await runtime.wait(None)"}}},
		// The root grants the summary and the operator scope.
		modeltest.Reply{Calls: []modeltest.Call{{ID: "r3", Code: "sums = [h.ref for h in await history.search('widget', scope={'lane': 'summary'})]\n" +
			"child = await agents.spawn(task='report on the widget', refs=sums + ['scope:operator'])\n" +
			"print('SPAWNED', child.id, sums)\nawait runtime.wait(None, reason='child')"}}},
		// The child.
		modeltest.Reply{Calls: []modeltest.Call{{ID: "k1", Code: "me = await agents.current()\ns = me.refs[0]\n" +
			"try:\n    await history.read(s)\n    print('READ WHOLE')\nexcept Exception as e:\n    print('DENIED', e)\n" +
			"for k in await history.children(s):\n    print('NARROW', k['ref'], k['kind'], (await history.read(k['ref'])).text)\n" +
			"print('HITS', [h.ref + ':' + h.lane for h in await history.search('widget')])"}}},
		modeltest.Reply{Calls: []modeltest.Call{{ID: "k2", Code: "await agents.finish('ok')"}}},
		modeltest.Reply{Text: "done", Calls: []modeltest.Call{{ID: "r4", Code: "await runtime.wait(None)"}}},
	)
	a := startJobsAgent(t, model)
	a.send("the widget deploy failed at noon")
	a.eventually("the root waits", func() bool { return model.Count() >= 1 && a.session().State == store.StateWaiting })
	a.send("the widget works again")
	a.eventually("the root waits again", func() bool { return model.Count() >= 2 && a.session().State == store.StateWaiting })
	out, err := a.c.Compact(t.Context(), "default")
	if err != nil || out.Kind != "normal" {
		t.Fatalf("compact: %+v %v", out, err)
	}
	d, err := a.c.ReadHistory(t.Context(), out.Summary, 1000, 0)
	if err != nil || len(d.Scopes) < 2 {
		t.Fatalf("the summary %s: %+v %v; want mixed scopes", out.Summary, d, err)
	}
	a.send("delegate a widget report")
	a.eventually("the root was woken by the child", func() bool { return said(model, "[klbr] child 1 succeeded") != "" })
	got := said(model, "HITS")
	if got == "" {
		t.Fatal("the child never reported")
	}
	if strings.Contains(got, "READ WHOLE") || !strings.Contains(got, "DENIED") || !strings.Contains(got, "covers scopes not granted") {
		t.Fatalf("the child read the mixed summary: %q", got)
	}
	if !strings.Contains(got, "NARROW") || !strings.Contains(got, "operator.input the widget deploy failed at noon") {
		t.Fatalf("the child's narrowed originals: %q", got)
	}
	if strings.Contains(got, "noted the widget") || strings.Contains(got, "cell.") {
		t.Fatalf("the narrowed originals hold the agent's own steps: %q", got)
	}
	hits := got[strings.Index(got, "HITS"):]
	if strings.Contains(hits, ":summary") || strings.Count(hits, ":input") != 4 {
		// the two granted operator inputs, the third (the delegation), and the child's own task
		t.Fatalf("the child's search: %q", hits)
	}
}

// A release whose job.plan refuses a child: the spawn fails with its
// reason and nothing is stored; so does one granting a ref that names
// nothing; the one job.plan admits is told its depth, refs and budget.
func TestJobPlanRefusesAChild(t *testing.T) {
	model := modeltest.New()
	defer model.Close()
	model.Then(
		modeltest.Reply{Calls: []modeltest.Call{{ID: "r1", Code: "try:\n    await agents.spawn(task='forbidden work')\n    print('SPAWNED FORBIDDEN')\n" +
			"except Exception as e:\n    print('REFUSED', e)\n" +
			"try:\n    await agents.spawn(task='unknown evidence', refs=['e999999'])\n    print('SPAWNED UNKNOWN')\n" +
			"except Exception as e:\n    print('NO GRANT', e)\n" +
			"child = await agents.spawn(task='fine work', refs=['scope:operator'], budget={'tokens': 10})\nprint('SPAWNED', child.id)\n" +
			"await runtime.wait(None, reason='child')"}}},
		modeltest.Reply{Calls: []modeltest.Call{{ID: "k1", Code: "await agents.finish('fine')"}}},
		modeltest.Reply{Text: "done", Calls: []modeltest.Call{{ID: "r2", Code: "await runtime.wait(None)"}}},
	)
	a := startAgentWithJobPlan(t, model, `
def plan(job):
    if job["kind"] != "child":
        return {"admit": True, "priority": 0, "reason": "admitted"}
    s = job["spec"]
    if "forbidden" in s["task"]:
        return {"admit": False, "priority": 0, "reason": "no forbidden children"}
    if s["depth"] != 1 or s["refs"] != ["scope:operator"] or s["budget"] != {"tokens": 10} or s["workspace"] != "" or s["profile"] != "":
        return {"admit": False, "priority": 0, "reason": "unexpected input %r" % (job,)}
    return {"admit": True, "priority": 7, "reason": "fine"}
`)
	a.send("spawn two children")
	a.eventually("the root was woken", func() bool { return model.Count() == 3 })
	root := said(model, "REFUSED")
	if !strings.Contains(root, "agents.spawn: refused by job.plan: no forbidden children") || !strings.Contains(root, "SPAWNED 1") {
		t.Fatalf("the root's spawns: %q", root)
	}
	if !strings.Contains(root, `NO GRANT refused: agents.spawn: ref "e999999" cannot be granted`) {
		t.Fatalf("a spawn granting a ref that names nothing: %q", root)
	}
	js, err := a.c.Jobs(t.Context(), "", "", 0)
	if err != nil || len(js.Jobs) != 1 || js.Jobs[0].Kind != "child" || js.Jobs[0].Priority != 7 || js.Jobs[0].State != store.JobSucceeded {
		t.Fatalf("jobs %+v, %v; want the admitted child, priority 7", js, err)
	}
}

// startAgentWithJobPlan starts klbr-core on the shipped behavior tree with
// its job.plan replaced by plan (Python defining plan(job)).
func startAgentWithJobPlan(t *testing.T, model *modeltest.Server, plan string) *agent {
	t.Helper()
	return startAgentWithTree(t, model, "", map[string]string{"klbr_hooks/jobs.py": plan})
}
