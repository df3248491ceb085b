package daemon

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

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

// startTreeAgent starts klbr-core on the test behavior tree with the extra
// klbr_skills modules in mods (name → source).
func startTreeAgent(t *testing.T, model *modeltest.Server, toml string, mods map[string]string) *agent {
	t.Helper()
	if os.Getenv(childEnv) != "" {
		t.Skip("in the child")
	}
	requirePython(t)
	tree := filepath.Join(t.TempDir(), "behavior")
	if err := os.CopyFS(tree, os.DirFS("../../behavior")); err != nil {
		t.Fatal(err)
	}
	for name, src := range mods {
		if err := os.WriteFile(filepath.Join(tree, "klbr_skills", name+".py"), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	data, env := instance(t)
	return startAgentAt(t, model, toml, "", data, append(env, "KLBR_BEHAVIOR_DIR="+tree))
}

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
	a := startTreeAgent(t, model, "", map[string]string{"e2e_hold": e2eHold})
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
