package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/api"
	"github.com/klbr-dev/klbr/internal/modeltest"
	"github.com/klbr-dev/klbr/internal/store"
)

// e2eHold is a routine of the test release that runs until its file exists.
const e2eHold = `import os, time


def hold(input):
    while not os.path.exists(input["path"]):
        time.sleep(0.05)
    return {"routine": input["text"]}
`

// requester names the session a request came from: child-N when its
// context holds child N's task, else the root, default.
func requester(req modeltest.Request) string {
	for _, m := range req.Messages {
		if _, after, ok := strings.Cut(content(m), "[klbr] You are child agent "); ok {
			var n int
			if _, err := fmt.Sscanf(after, "%d", &n); err == nil {
				return store.ChildSessionID(int64(n))
			}
		}
	}
	return "default"
}

// sessionAnswers answers each session's requests with its own script, in
// order, by requester; past a script's end a session waits.
type sessionAnswers struct {
	mu      sync.Mutex
	scripts map[string]func(step int, req modeltest.Request) modeltest.Reply
	steps   map[string]int
}

func answerBySession(model *modeltest.Server, scripts map[string]func(step int, req modeltest.Request) modeltest.Reply) *sessionAnswers {
	s := &sessionAnswers{scripts: scripts, steps: map[string]int{}}
	model.Answer(func(_ int, req modeltest.Request) modeltest.Reply {
		s.mu.Lock()
		defer s.mu.Unlock()
		who := requester(req)
		s.steps[who]++
		if f := s.scripts[who]; f != nil {
			return f(s.steps[who], req)
		}
		return modeltest.Reply{Calls: []modeltest.Call{{Code: "await runtime.wait(None)"}}}
	})
	return s
}

// requests is how many requests session made.
func (s *sessionAnswers) requests(session string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.steps[session]
}

// eventuallyIn is eventually, dumping session's records when it times out.
func (a *agent) eventuallyIn(session, what string, cond func() bool) {
	a.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			var b strings.Builder
			for _, r := range a.sessionRecords(session) {
				fmt.Fprintf(&b, "%d %s %s %s\n", r.Seq, r.Lane, r.Kind, r.Content)
			}
			a.t.Fatalf("timed out waiting: %s\nrecords of %s:\n%s", what, session, b.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func waitCall(id string) modeltest.Reply {
	return modeltest.Reply{Calls: []modeltest.Call{{ID: id, Code: "await runtime.wait(None)"}}}
}

// "Long-lived work without a long-lived stack": the root spawns a child
// and schedules a routine, then the operator resets its kernel while both
// run. Both outlive it; their identities, pinned revisions and outcomes
// stay queryable; the root wakes to exactly one completion per job and
// continues from the result and its history in a new kernel, without the
// coroutine its former kernel held.
func TestLongLivedWorkOutlivesTheRootsKernel(t *testing.T) {
	model := modeltest.New()
	defer model.Close()
	dir := t.TempDir()
	routineGo, childGo := filepath.Join(dir, "routine-go"), filepath.Join(dir, "child-go")
	answers := answerBySession(model, map[string]func(int, modeltest.Request) modeltest.Reply{
		"default": func(step int, req modeltest.Request) modeltest.Reply {
			woke := lastUser(req)
			switch {
			case step == 1:
				return modeltest.Reply{Calls: []modeltest.Call{{ID: "r1", Code: "import asyncio, time\n" +
					"child = await agents.spawn(task='survey the repository', budget={'model_requests': 10})\n" +
					fmt.Sprintf("routine = await jobs.schedule('klbr_skills.e2e_hold:hold', at=time.time() + 0.2, input={'path': %q, 'text': 'checked'})\n", routineGo) +
					"marker = 'the old kernel'\n" +
					"waiter = asyncio.ensure_future(child.result())\n" +
					"print('STARTED', child.id, routine.id, flush=True)\n" +
					"await runtime.wait(None, reason='the child and the routine run')"}}}
			case strings.HasPrefix(woke, "[klbr] job 2 succeeded"):
				return modeltest.Reply{Calls: []modeltest.Call{{ID: "r2", Code: "r = await jobs.get(2)\n" +
					"print('AFTER RESET', 'marker' in globals(), 'waiter' in globals(), r.state, r.result_value, flush=True)\n" +
					"await runtime.wait(None, reason='the child still runs')"}}}
			case strings.HasPrefix(woke, "[klbr] child 1 succeeded"):
				return modeltest.Reply{Calls: []modeltest.Call{{ID: "r3", Code: "c = await agents.get(1)\n" +
					"print('CHILD', c.state, c.session, c.result_value, flush=True)\n" +
					"await runtime.wait(None)"}}}
			}
			return waitCall("")
		},
		"child-1": func(step int, _ modeltest.Request) modeltest.Reply {
			switch step {
			case 1:
				return modeltest.Reply{Calls: []modeltest.Call{{ID: "k1", Code: "import asyncio, os\nprint('SURVEYING', flush=True)\n" +
					fmt.Sprintf("while not os.path.exists(%q):\n    await asyncio.sleep(0.05)\nprint('SURVEYED')", childGo)}}}
			case 2:
				return modeltest.Reply{Calls: []modeltest.Call{{ID: "k2", Code: "await agents.finish({'survey': 'done'})"}}}
			}
			return waitCall("")
		},
	})
	a := startAgentWithTree(t, model, "", map[string]string{"klbr_skills/e2e_hold.py": e2eHold})
	a.send("survey the repository and check it later")
	a.eventually("the child's cell runs", func() bool { return a.cellSaid("child-1", "SURVEYING") })
	a.eventually("the routine runs", func() bool { j, err := a.c.Job(t.Context(), 2); return err == nil && j.State == store.JobRunning })
	a.eventually("the root waits", a.state(store.StateWaiting))
	before := a.session()
	if !a.cellSaid("default", "STARTED 1 2") || before.KernelGen == 0 {
		t.Fatalf("the root's first cell: %+v\n%s", before.Session, a.dump())
	}

	// The operator resets the root's context and kernel (klbr-core reset
	// default --kernel) while both run.
	if _, err := a.c.Reset(t.Context(), "default", "the long-lived proof", true); err != nil {
		t.Fatal(err)
	}
	release := before.PolicyRevision
	for _, id := range []int64{1, 2} {
		j, err := a.c.Job(t.Context(), id)
		if err != nil || j.State != store.JobRunning || j.Session != "default" || j.Release != release {
			t.Fatalf("after the reset job %d is %+v, %v; want running, the root's, pinned to %s", id, j, err, release)
		}
	}
	cs, err := a.c.Session(t.Context(), "child-1")
	if err != nil || cs.ParentID != "default" || cs.PolicyRevision != release || cs.State != store.StateRunning {
		t.Fatalf("the child after the reset: %+v, %v", cs.Session, err)
	}
	js, err := a.c.Jobs(t.Context(), "default", "", 100) // klbr-core jobs default
	if err != nil || len(js.Jobs) != 2 || js.Jobs[0].Kind != "routine" || js.Jobs[1].Kind != "child" {
		t.Fatalf("klbr-core jobs: %+v, %v", js.Jobs, err)
	}

	// The routine ends: the root wakes in a new kernel and reads it.
	if err := os.WriteFile(routineGo, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// Neither its variables nor the coroutine of its former kernel are
	// there; the routine's outcome is, from the record.
	a.eventually("the root read the routine in a new kernel", func() bool {
		return a.cellSaid("default", "AFTER RESET False False succeeded {'routine': 'checked'}")
	})
	if s := a.session(); s.KernelGen <= before.KernelGen || s.ContextEpoch <= before.ContextEpoch {
		t.Fatalf("the root's kernel generation %d and context epoch %d after the reset, before %d and %d", s.KernelGen, s.ContextEpoch, before.KernelGen, before.ContextEpoch)
	}
	if cs, _ := a.c.Session(t.Context(), "child-1"); cs.KernelGen != 1 || cs.State != store.StateRunning {
		t.Fatalf("the child's kernel: generation %d, %s; the root's reset reached it", cs.KernelGen, cs.State)
	}

	// The child ends: the root is woken once more, and reads its result
	// through agents.get, the handle rebuilt from the record.
	if err := os.WriteFile(childGo, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	a.eventually("the root read the child", func() bool { return a.cellSaid("default", "CHILD succeeded child-1 {'survey': 'done'}") })
	a.eventually("the root waits again", a.state(store.StateWaiting))
	time.Sleep(time.Second)
	in := a.jobInputs()
	if len(in) != 2 || strings.Count(strings.Join(in, "\n"), "[klbr] job 2 succeeded") != 1 || strings.Count(strings.Join(in, "\n"), "[klbr] child 1 succeeded") != 1 {
		t.Fatalf("the root's completion inputs %q: want one per job", in)
	}
	if n := answers.requests("default"); n != 3 {
		t.Fatalf("the root made %d model requests, want 3 (start, the routine, the child)", n)
	}
	for id, want := range map[int64]string{1: `{"survey":"done"}`, 2: `{"routine":"checked"}`} {
		if j, err := a.c.Job(t.Context(), id); err != nil || j.State != store.JobSucceeded || compact(j.Result) != want || j.Release != release {
			t.Fatalf("job %d at the end: %+v (%s), %v; want succeeded with %s", id, j, j.Result, err, want)
		}
	}
}

func compact(b json.RawMessage) string {
	var v any
	if json.Unmarshal(b, &v) != nil {
		return string(b)
	}
	out, _ := json.Marshal(v)
	return string(out)
}

// The operator's commands on a child by its session id, as klbr-core
// status, tail, reset, stop, start and send call them: each reaches the
// child and only the child (a reset of the child resets its kernel, not
// the root's), and the child still reports to its parent once.
func TestOperatorCommandsOnAChild(t *testing.T) {
	model := modeltest.New()
	defer model.Close()
	childGo := filepath.Join(t.TempDir(), "child-go")
	// The root waits from its first cell until the child ends: the requests
	// come one session at a time.
	model.Then(
		modeltest.Reply{Calls: []modeltest.Call{{ID: "r1", Code: "marker = 'the root kernel'\nchild = await agents.spawn(task='dig')\n" +
			"await runtime.wait(None, reason=f'child {child.id}')"}}},
		modeltest.Reply{Calls: []modeltest.Call{{ID: "k1", Code: "import asyncio, os\nkid = 'the child kernel'\nprint('DIGGING', flush=True)\n" +
			fmt.Sprintf("while not os.path.exists(%q):\n    await asyncio.sleep(0.05)", childGo)}}},
		modeltest.Reply{Calls: []modeltest.Call{{ID: "k2", Code: "print('CHILD AFTER RESET', 'kid' in globals(), flush=True)\nawait runtime.wait(None, reason='told to wait')"}}},
		modeltest.Reply{Calls: []modeltest.Call{{ID: "k3", Code: "await agents.finish('dug')"}}},
		modeltest.Reply{Calls: []modeltest.Call{{ID: "r2", Code: "print('ROOT KERNEL', marker, (await agents.get(1)).result_value, flush=True)\nawait runtime.wait(None)"}}},
	)
	a := startJobsAgent(t, model)
	a.send("dig through a child")
	a.eventually("the child's cell runs", func() bool { return a.cellSaid("child-1", "DIGGING") })
	root := a.session()

	// klbr-core status child-1
	cs, err := a.c.Session(t.Context(), "child-1")
	if err != nil || cs.ParentID != "default" || cs.State != store.StateRunning || cs.Attempt == nil || cs.Attempt.State != store.AttemptRunning || cs.KernelGen != 1 {
		t.Fatalf("status child-1: %+v, %v", cs, err)
	}
	// klbr-core tail child-1: the child's own lanes, its task first.
	recs := a.sessionRecords("child-1")
	var task, cell bool
	for _, r := range recs {
		task = task || r.Lane == store.LaneInput && strings.Contains(string(r.Content), "You are child agent 1 of session default")
		cell = cell || r.Kind == "cell.started" && strings.Contains(string(r.Content), "DIGGING")
	}
	if !task || !cell {
		t.Fatalf("tail child-1: task %v, cell %v", task, cell)
	}
	for _, r := range a.records() {
		if strings.Contains(string(r.Content), "DIGGING") {
			t.Fatalf("the child's cell is on the root's lanes: %s %s", r.Kind, r.Content)
		}
	}
	// klbr-core sessions: the child's usage so far.
	if u, err := a.c.Usage(t.Context(), "child-1"); err != nil || u.ModelRequests != 1 || u.Session != "child-1" {
		t.Fatalf("usage of child-1: %+v, %v", u, err)
	}

	// klbr-core stop child-1: its cell is cut off, its session stops; its
	// job runs on (stop is not cancel).
	if s, err := a.c.StopSession(t.Context(), "child-1"); err != nil || s.State != store.StateStopped {
		t.Fatalf("stop child-1: %+v, %v", s, err)
	}
	a.eventually("the child's cell ended", func() bool {
		cs, err := a.c.Session(t.Context(), "child-1")
		return err == nil && cs.Attempt != nil && cs.Attempt.State != store.AttemptRunning
	})
	if j, err := a.c.Job(t.Context(), 1); err != nil || j.State != store.JobRunning {
		t.Fatalf("the child's job after stop: %+v, %v", j, err)
	}
	// klbr-core reset child-1 --kernel, the session stopped: its next cell
	// runs in a new kernel; the root's kernel and context are untouched.
	// (A reset while a cell runs: TestKernelResetInterruptsARunningCell.)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if _, err := a.c.Reset(ctx, "child-1", "dig differently", true); err != nil {
		t.Fatal(err)
	}
	// klbr-core start child-1: its interrupted attempt resumes as a new one.
	if s, err := a.c.StartSession(t.Context(), "child-1"); err != nil || s.State != store.StateReady {
		t.Fatalf("start child-1: %+v, %v", s, err)
	}
	a.eventuallyIn("child-1", "the child runs in a new kernel", func() bool { return a.cellSaid("child-1", "CHILD AFTER RESET False") })
	a.eventually("the child waits", func() bool {
		cs, err := a.c.Session(t.Context(), "child-1")
		return err == nil && cs.State == store.StateWaiting
	})
	if cs, _ := a.c.Session(t.Context(), "child-1"); cs.KernelGen != 2 {
		t.Fatalf("the child's kernel generation %d after its reset, want 2", cs.KernelGen)
	}
	if s := a.session(); s.KernelGen != root.KernelGen || s.ContextEpoch != root.ContextEpoch || s.State != store.StateWaiting {
		t.Fatalf("the root after the child's reset: %+v; before %+v", s.Session, root.Session)
	}
	for _, r := range a.records() {
		if r.Kind == "kernel.reset" || r.Kind == "context.reset" {
			t.Fatalf("the child's reset reached the root: %s %s", r.Kind, r.Content)
		}
	}
	// klbr-core send child-1: the operator's input wakes it; it finishes.
	if _, err := a.c.Send(t.Context(), "child-1", api.SendRequest{Text: "finish now", SourceKey: "to-the-child-2"}); err != nil {
		t.Fatal(err)
	}
	a.eventually("the root read the child's result", func() bool { return a.cellSaid("default", "ROOT KERNEL the root kernel dug") })
	a.eventually("the root waits again", a.state(store.StateWaiting))
	time.Sleep(time.Second)
	if in := a.jobInputs(); len(in) != 1 || !strings.HasPrefix(in[0], "[klbr] child 1 succeeded") || model.Count() != 5 {
		t.Fatalf("the root's notifications %q after %d requests; want one, 5", in, model.Count())
	}
	os.WriteFile(childGo, nil, 0o644)
}

// SIGKILL of klbr-core while four children are in four states: one in a
// model request, one in a running cell, one waiting, one finished. After
// the restart each child's state is honest: the busy ones are still
// running and resume with a new attempt (a child is its session: its job
// is never left for recovery to guess), the waiting one waits on, the
// finished one stays finished; and each child's result reaches the parent
// exactly once.
func TestChildrenInEveryStateAfterKill(t *testing.T) {
	model := modeltest.New()
	defer model.Close()
	hold := make(chan struct{})
	defer close(hold)
	finish := func(id, result string) modeltest.Reply {
		return modeltest.Reply{Calls: []modeltest.Call{{ID: id, Code: fmt.Sprintf("await agents.finish(%q)", result)}}}
	}
	answers := answerBySession(model, map[string]func(int, modeltest.Request) modeltest.Reply{
		"default": func(step int, _ modeltest.Request) modeltest.Reply {
			if step == 1 {
				return modeltest.Reply{Calls: []modeltest.Call{{ID: "r1", Code: "for task in ['think', 'compute', 'wait', 'finish']:\n" +
					"    await agents.spawn(task=task)\n" +
					"await runtime.wait(None, reason='four children')"}}}
			}
			return waitCall("")
		},
		"child-1": func(step int, _ modeltest.Request) modeltest.Reply { // in a model request at the kill
			if step == 1 {
				return modeltest.Reply{Text: "thinking hard about it", Hold: hold, HoldAfter: 2}
			}
			return finish("a2", "one after the restart")
		},
		"child-2": func(step int, _ modeltest.Request) modeltest.Reply { // in a running cell
			if step == 1 {
				return modeltest.Reply{Calls: []modeltest.Call{{ID: "b1", Code: "import asyncio\nprint('COMPUTING', flush=True)\nawait asyncio.sleep(120)"}}}
			}
			return finish("b2", "two after the restart")
		},
		"child-3": func(step int, _ modeltest.Request) modeltest.Reply { // waiting
			if step == 1 {
				return modeltest.Reply{Calls: []modeltest.Call{{ID: "c1", Code: "await runtime.wait(None, reason='until the operator says')"}}}
			}
			return finish("c2", "three when told")
		},
		"child-4": func(step int, _ modeltest.Request) modeltest.Reply { // finished before the kill
			if step == 1 {
				return finish("d1", "four before the kill")
			}
			return waitCall("")
		},
	})
	a := startJobsAgent(t, model)
	a.send("start four children")
	childState := func(session string) store.SessionState {
		cs, err := a.c.Session(t.Context(), session)
		if err != nil {
			return ""
		}
		return cs.State
	}
	a.eventually("child-1 is in its model request", func() bool { return answers.requests("child-1") == 1 && childState("child-1") == store.StateRunning })
	a.eventually("child-2's cell runs", func() bool { return a.cellSaid("child-2", "COMPUTING") })
	a.eventually("child-3 waits", func() bool { return childState("child-3") == store.StateWaiting })
	a.eventually("child-4 finished and the root heard it", func() bool {
		j, err := a.c.Job(t.Context(), 4)
		return err == nil && j.State == store.JobSucceeded && childState("child-4") == store.StateWaiting &&
			len(a.jobInputs()) == 1 && a.session().State == store.StateWaiting
	})
	if n := answers.requests("child-1"); n != 1 {
		t.Fatalf("child-1 made %d requests before the kill, want 1 (held)", n)
	}
	a.kill()
	a.start()

	// Right after the restart: honest states.
	for id, want := range map[int64]store.JobState{1: store.JobRunning, 2: store.JobRunning, 3: store.JobRunning, 4: store.JobSucceeded} {
		if j, err := a.c.Job(t.Context(), id); err != nil || j.State != want || j.Kind != "child" {
			t.Fatalf("after the restart child job %d is %+v, %v; want %s", id, j, err, want)
		}
	}
	if j, _ := a.c.Job(t.Context(), 4); compact(j.Result) != `"four before the kill"` {
		t.Fatalf("the finished child's result after the restart: %s", j.Result)
	}
	a.eventually("the busy children resume and finish", func() bool {
		j1, err1 := a.c.Job(t.Context(), 1)
		j2, err2 := a.c.Job(t.Context(), 2)
		return err1 == nil && err2 == nil && j1.State == store.JobSucceeded && j2.State == store.JobSucceeded
	})
	if st := childState("child-3"); st != store.StateWaiting {
		t.Fatalf("the waiting child after the restart is %s, want still waiting", st)
	}
	if _, err := a.c.Send(t.Context(), "child-3", api.SendRequest{Text: "finish now", SourceKey: "tell-child-3"}); err != nil {
		t.Fatal(err)
	}
	a.eventually("the waiting child finishes when told", func() bool { j, err := a.c.Job(t.Context(), 3); return err == nil && j.State == store.JobSucceeded })
	a.eventually("the root heard all four", func() bool { return len(a.jobInputs()) >= 4 })
	a.eventually("the root waits again", a.state(store.StateWaiting))
	time.Sleep(time.Second)

	in := strings.Join(a.jobInputs(), "\n")
	for id, result := range map[int]string{1: "one after the restart", 2: "two after the restart", 3: "three when told", 4: "four before the kill"} {
		if n := strings.Count(in, fmt.Sprintf("[klbr] child %d succeeded", id)); n != 1 || !strings.Contains(in, result) {
			t.Errorf("child %d's result reached the root %d times (want once, with %q)", id, n, result)
		}
	}
	if n := len(a.jobInputs()); n != 4 {
		t.Fatalf("the root's notifications:\n%s\nwant four", in)
	}
	for session, want := range map[string]int{"child-1": 2, "child-2": 2, "child-3": 2, "child-4": 1} {
		if n := answers.requests(session); n != want {
			t.Errorf("%s made %d model requests, want %d", session, n, want)
		}
	}
}
