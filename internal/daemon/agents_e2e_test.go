package daemon

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/modeltest"
	"github.com/klbr-dev/klbr/internal/store"
)

// lastMessage is the content of a request's last message.
func lastMessage(req modeltest.Request) string {
	return content(req.Messages[len(req.Messages)-1])
}

// childRecords reads a session's records.
func (a *agent) sessionRecords(session string) []store.Record {
	a.t.Helper()
	page, err := a.c.Records(a.t.Context(), session, 0, 1000)
	if err != nil {
		a.t.Fatal(err)
	}
	return page.Records
}

// cellSaid reports whether a cell of session printed text (false while the
// session does not exist).
func (a *agent) cellSaid(session, text string) bool {
	page, err := a.c.Records(a.t.Context(), session, 0, 1000)
	if err != nil {
		return false
	}
	for _, r := range page.Records {
		if r.Lane == store.LaneCell && strings.Contains(string(r.Content), text) {
			return true
		}
	}
	return false
}

// The root spawns a child and waits; the child, refused local.send without
// delegation, finishes with a result; the root is woken once by it and
// reads the result from the record.
func TestChildAgentReportsBackOnce(t *testing.T) {
	model := modeltest.New()
	defer model.Close()
	model.Then(
		// 1, the root: spawn and wait.
		modeltest.Reply{Calls: []modeltest.Call{{ID: "r1", Code: "hits = [h for h in await history.search('widget', scope={'lane': 'input'})]\n" +
			"child = await agents.spawn(task='count the widgets', refs=[hits[0].ref])\n" +
			"print('SPAWNED', child.id, child.session, child.state)\n" +
			"await runtime.wait(None, reason=f'child {child.id}')"}}},
		// 2, the child: its task; it tries to speak to the operator.
		modeltest.Reply{Calls: []modeltest.Call{{ID: "k1", Code: "me = await agents.current()\n" +
			"print('GRANTED', me.refs, (await history.read(me.refs[0])).text)\n" +
			"try:\n    await history.read('e1')\n    print('READ e1')\nexcept Exception as e:\n    print('DENIED e1', e)\n" +
			"try:\n    await local.send('hello from the child')\n    print('SENT')\n" +
			"except Exception as e:\n    print('REFUSED', e)"}}},
		// 3, the child: it finishes.
		modeltest.Reply{Calls: []modeltest.Call{{ID: "k2", Code: "await agents.finish({'widgets': 3})"}}},
		// 4, the root, woken: it reads the result.
		modeltest.Reply{Calls: []modeltest.Call{{ID: "r2", Code: "c = await agents.get(1)\n" +
			"print('RESULT', c.state, c.session, c.result_value['widgets'], await c.result(timeout=5))"}}},
		modeltest.Reply{Text: "Three widgets.", Calls: []modeltest.Call{{ID: "r3", Code: "await runtime.wait(None)"}}},
	)
	a := startJobsAgent(t, model)
	a.send("delegate the widget count")
	a.eventually("the root read the result", func() bool { return model.Count() == 5 })
	reqs := model.Requests()
	if got := lastMessage(reqs[1]); !strings.Contains(got, "count the widgets") || !strings.Contains(got, "history.read") {
		t.Fatalf("the child's first request ends with %q, want its task", got)
	}
	for _, m := range reqs[1].Messages {
		if strings.Contains(content(m), "delegate the widget count") {
			t.Fatalf("the child saw the root's input: %q", content(m))
		}
	}
	got := lastMessage(reqs[2])
	if !strings.Contains(got, "REFUSED refused") || !strings.Contains(got, "did not delegate local.send") {
		t.Fatalf("the child's local.send: %q, want refused", got)
	}
	// The ref it was granted reads; another of the root's records does not.
	if !strings.Contains(got, "GRANTED ['e") || !strings.Contains(got, "delegate the widget count") {
		t.Fatalf("the child's granted read: %q", got)
	}
	if !strings.Contains(got, "DENIED e1") && !strings.Contains(got, "GRANTED ['e1']") {
		t.Fatalf("the child read a record of the root it was not granted: %q", got)
	}
	if woke := lastUser(reqs[3]); !strings.HasPrefix(woke, "[klbr] child 1 succeeded") || !strings.Contains(woke, `{"widgets":3}`) {
		t.Fatalf("the root woke to %q", woke)
	}
	if got := lastMessage(reqs[4]); !strings.Contains(got, "RESULT succeeded child-1 3 {'widgets': 3}") {
		t.Fatalf("the root read %q", got)
	}
	a.eventually("the root waits again", a.state(store.StateWaiting))
	time.Sleep(time.Second)
	if n := model.Count(); n != 5 {
		t.Fatalf("%d model requests, want 5", n)
	}
	if in := a.jobInputs(); len(in) != 1 {
		t.Fatalf("child notifications %q, want one", in)
	}
	j, err := a.c.Job(t.Context(), 1)
	if err != nil || j.Kind != "child" || j.State != store.JobSucceeded || string(j.Result) != `{"widgets":3}` || j.Session != "default" {
		t.Fatalf("child job %+v, %v", j, err)
	}
	cs, err := a.c.Session(t.Context(), "child-1")
	if err != nil || cs.ParentID != "default" || cs.PolicyRevision == "" || cs.PolicyRevision != a.session().PolicyRevision {
		t.Fatalf("child session %+v, %v; want parent default, the root's release", cs.Session, err)
	}
	for _, r := range a.sessionRecords("child-1") {
		if r.Lane == store.LaneSpeech {
			t.Fatalf("the child spoke: %s %s", r.Kind, r.Content)
		}
	}
	// The finished child's kernel is stopped with its end (after its cell).
	a.eventually("the finished child's kernel stopped", func() bool {
		for _, r := range a.sessionRecords("child-1") {
			if r.Kind == "kernel.reset" && strings.Contains(string(r.Content), "child 1 ended") {
				return true
			}
		}
		return false
	})
	for _, r := range a.records() {
		if r.Lane == store.LaneSpeech && strings.Contains(string(r.Content), "hello from the child") {
			t.Fatalf("the child's text reached the root's lane: %s", r.Content)
		}
	}
}

// With local.send delegated, the child's send is delivered on its own
// speech lane and its receipt names the child.
func TestDelegatedSendNamesTheChild(t *testing.T) {
	model := modeltest.New()
	defer model.Close()
	model.Then(
		modeltest.Reply{Calls: []modeltest.Call{{ID: "r1", Code: "child = await agents.spawn(task='greet', delegate=['local.send'])\n" +
			"await runtime.wait(None)"}}},
		modeltest.Reply{Calls: []modeltest.Call{{ID: "k1", Code: "r = await local.send('hello from the child')\nprint('RECEIPT', r.status, r['child'])"}}},
		// The child ends its turn without agents.finish: its text is the result.
		modeltest.Reply{Text: "I greeted the operator."},
		modeltest.Reply{Text: "The child greeted.", Calls: []modeltest.Call{{ID: "r2", Code: "await runtime.wait(None)"}}},
	)
	a := startJobsAgent(t, model)
	a.send("greet through a child")
	a.eventually("the root was woken", func() bool { return model.Count() == 4 })
	reqs := model.Requests()
	if got := lastMessage(reqs[2]); !strings.Contains(got, "RECEIPT confirmed") || !strings.Contains(got, "'session': 'child-1'") {
		t.Fatalf("the delegated send: %q", got)
	}
	if woke := lastUser(reqs[3]); !strings.HasPrefix(woke, "[klbr] child 1 succeeded") || !strings.Contains(woke, "without agents.finish") {
		t.Fatalf("the root woke to %q", woke)
	}
	var spoke bool
	for _, r := range a.sessionRecords("child-1") {
		if r.Lane == store.LaneSpeech && strings.Contains(string(r.Content), "hello from the child") {
			spoke = true
		}
	}
	if !spoke {
		t.Fatal("the delegated send is not on the child's speech lane")
	}
	j, err := a.c.Job(t.Context(), 1)
	var res struct {
		Text     string
		Implicit bool
	}
	if err != nil || json.Unmarshal(j.Result, &res) != nil || !res.Implicit || res.Text != "I greeted the operator." {
		t.Fatalf("child job %+v (%s), %v", j, j.Result, err)
	}
}

// SIGKILL of klbr-core while a child's cell runs: after the restart the
// child's job is still running, its session resumes with a new attempt,
// it finishes, and the parent is woken exactly once.
func TestChildSurvivesKillAndReportsOnce(t *testing.T) {
	model := modeltest.New()
	defer model.Close()
	model.Then(
		modeltest.Reply{Calls: []modeltest.Call{{ID: "r1", Code: "child = await agents.spawn(task='take your time')\n" +
			"await runtime.wait(None, reason=f'child {child.id}')"}}},
		modeltest.Reply{Calls: []modeltest.Call{{ID: "k1", Code: "import asyncio\nprint('WORKING', flush=True)\nawait asyncio.sleep(120)"}}},
		// After the restart the child's interrupted attempt resumes.
		modeltest.Reply{Calls: []modeltest.Call{{ID: "k2", Code: "await agents.finish('done after a restart')"}}},
		modeltest.Reply{Text: "The child is done.", Calls: []modeltest.Call{{ID: "r2", Code: "await runtime.wait(None)"}}},
	)
	a := startJobsAgent(t, model)
	a.send("start a slow child")
	a.eventually("the child's cell runs", func() bool { return a.cellSaid("child-1", "WORKING") })
	a.kill()
	if n := model.Count(); n != 2 {
		t.Fatalf("%d model requests before the restart, want 2", n)
	}
	a.start()
	if j, err := a.c.Job(t.Context(), 1); err != nil || j.State != store.JobRunning {
		t.Fatalf("after the restart the child's job is %+v, %v; want running", j, err)
	}
	a.eventually("the root was woken", func() bool { return model.Count() == 4 })
	reqs := model.Requests()
	if woke := lastUser(reqs[3]); !strings.HasPrefix(woke, "[klbr] child 1 succeeded") || !strings.Contains(woke, "done after a restart") {
		t.Fatalf("the root woke to %q", woke)
	}
	a.eventually("the root waits again", a.state(store.StateWaiting))
	time.Sleep(time.Second)
	if in := a.jobInputs(); len(in) != 1 || model.Count() != 4 {
		t.Fatalf("notifications %q, %d model requests; want one and 4", in, model.Count())
	}
	if j, _ := a.c.Job(t.Context(), 1); j.State != store.JobSucceeded || string(j.Result) != `"done after a restart"` {
		t.Fatalf("child job %+v", j)
	}
}

// The operator cancels a busy child: its cell is cut off, its session
// stops, it makes no more model requests, and its parent is told once.
func TestCancelStopsABusyChild(t *testing.T) {
	model := modeltest.New()
	defer model.Close()
	model.Then(
		modeltest.Reply{Calls: []modeltest.Call{{ID: "r1", Code: "child = await agents.spawn(task='spin')\n" +
			"await runtime.wait(None, reason=f'child {child.id}')"}}},
		modeltest.Reply{Calls: []modeltest.Call{{ID: "k1", Code: "import asyncio\nprint('SPINNING', flush=True)\nawait asyncio.sleep(120)"}}},
		modeltest.Reply{Text: "The child was cancelled.", Calls: []modeltest.Call{{ID: "r2", Code: "await runtime.wait(None)"}}},
	)
	a := startJobsAgent(t, model)
	a.send("start a child that spins")
	a.eventually("the child's cell runs", func() bool { return a.cellSaid("child-1", "SPINNING") })
	j, err := a.c.CancelJob(t.Context(), 1)
	if err != nil || j.State != store.JobCancelled {
		t.Fatalf("cancel: %+v, %v", j, err)
	}
	a.eventually("the root was told", func() bool { return model.Count() == 3 })
	if woke := lastUser(model.Requests()[2]); !strings.HasPrefix(woke, "[klbr] child 1 cancelled") {
		t.Fatalf("the root woke to %q", woke)
	}
	cs, err := a.c.Session(t.Context(), "child-1")
	if err != nil || cs.State != store.StateStopped {
		t.Fatalf("the child's session %+v, %v; want stopped", cs.Session, err)
	}
	a.eventually("the child's cell ended", func() bool {
		cs, err := a.c.Session(t.Context(), "child-1")
		return err == nil && cs.Attempt != nil && cs.Attempt.State != store.AttemptRunning
	})
	time.Sleep(time.Second)
	if n := model.Count(); n != 3 {
		t.Fatalf("%d model requests, want 3: the cancelled child went on", n)
	}
	if in := a.jobInputs(); len(in) != 1 {
		t.Fatalf("notifications %q, want one", in)
	}
}

// Attack: the root spawns child-1 without speech; child-1 spawns a
// grandchild granting it local.send, and the grandchild sends. Delegation
// narrows down the tree: the spawn is refused (child-1 holds no speech),
// so nothing under child-1 speaks, on any lane.
func TestGrandchildOfAnUndelegatedChildCannotSpeak(t *testing.T) {
	model := modeltest.New()
	defer model.Close()
	send := "try:\n    await local.send('hello from below')\n    print('SENT')\nexcept Exception as e:\n    print('SEND REFUSED', e)"
	model.Then(
		modeltest.Reply{Calls: []modeltest.Call{{ID: "r1", Code: "child = await agents.spawn(task='stay quiet')\n" +
			"await runtime.wait(None, reason=f'child {child.id}')"}}},
		// child-1: it grants what it does not hold.
		modeltest.Reply{Calls: []modeltest.Call{{ID: "k1", Code: "try:\n" +
			"    g = await agents.spawn(task='speak for me', delegate=['local.send'])\n" +
			"    print('SPAWNED', g.session)\n    await runtime.wait(None, reason='grandchild')\n" +
			"except Exception as e:\n    print('SPAWN REFUSED', e)"}}},
		// Whoever asks next (the grandchild, had it been spawned) sends.
		modeltest.Reply{Calls: []modeltest.Call{{ID: "k2", Code: send}}},
		modeltest.Reply{Calls: []modeltest.Call{{ID: "k3", Code: "await agents.finish('done')"}}},
		modeltest.Reply{Text: "Done.", Calls: []modeltest.Call{{ID: "r2", Code: "await runtime.wait(None)"}}},
	)
	a := startJobsAgent(t, model)
	a.send("delegate down two levels")
	a.eventually("four model requests", func() bool { return model.Count() >= 4 })
	for _, s := range []string{"default", "child-1", "child-2"} {
		page, err := a.c.Records(t.Context(), s, 0, 1000)
		if err != nil {
			continue // child-2 does not exist
		}
		for _, r := range page.Records {
			if r.Lane == store.LaneSpeech && strings.Contains(string(r.Content), "hello from below") {
				t.Fatalf("%s spoke under an undelegated child: %s", s, r.Content)
			}
		}
	}
	got := lastMessage(model.Requests()[2])
	if !strings.Contains(got, "SPAWN REFUSED refused") || !strings.Contains(got, "child-1 holds no speech") {
		t.Fatalf("child-1's spawn granting local.send: %q, want refused", got)
	}
	if _, err := a.c.Session(t.Context(), "child-2"); err == nil {
		t.Fatal("the refused grandchild's session exists")
	}
}
