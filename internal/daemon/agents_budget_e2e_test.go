package daemon

import (
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/modeltest"
	"github.com/klbr-dev/klbr/internal/store"
)

// startAgentsAgent is startJobsAgent with toml added to klbr.toml.
func startAgentsAgent(t *testing.T, model *modeltest.Server, toml string) *agent {
	t.Helper()
	return startAgentWithTree(t, model, toml, map[string]string{"klbr_skills/e2e_jobs.py": e2eJobs})
}

// A child's budget stops its next model request: it spends 60 tokens of
// 50 in its first, is ended failed before the second with the reason and a
// result saying so, and its parent is woken once; the tree's tokens
// (agents.max_tree_tokens = 50) then refuse a new spawn, naming the key.
func TestChildBudgetStopsRequestsAndSpawns(t *testing.T) {
	model := modeltest.New()
	defer model.Close()
	usage := map[string]any{"prompt_tokens": 40, "completion_tokens": 20, "total_tokens": 60}
	model.Then(
		modeltest.Reply{Calls: []modeltest.Call{{ID: "r1", Code: "child = await agents.spawn(task='spend', budget={'tokens': 50})\n" +
			"await runtime.wait(None, reason=f'child {child.id}')"}}},
		// The child's one request: 60 tokens.
		modeltest.Reply{Usage: usage, Calls: []modeltest.Call{{ID: "k1", Code: "print('SPENT')"}}},
		// The root, woken by the child's end.
		modeltest.Reply{Calls: []modeltest.Call{{ID: "r2", Code: "c = await agents.get(1)\nprint('CHILD', c.state, c.error, c.result_value['budget_exhausted'])\n" +
			"try:\n    await agents.spawn(task='again')\n    print('SPAWNED')\nexcept Exception as e:\n    print('REFUSED', e)"}}},
		modeltest.Reply{Text: "The child ran out.", Calls: []modeltest.Call{{ID: "r3", Code: "await runtime.wait(None)"}}},
	)
	a := startAgentsAgent(t, model, "[agents]\nmax_tree_tokens = 50\n")
	a.send("delegate something expensive")
	a.eventually("the root read the child's end", func() bool { return model.Count() == 4 })
	reqs := model.Requests()
	if woke := lastUser(reqs[2]); !strings.HasPrefix(woke, "[klbr] child 1 failed (session child-1, budget exhausted). Error: budget exhausted: tokens 60 of 50 (budget.tokens)") {
		t.Fatalf("the root woke to %q", woke)
	}
	got := lastMessage(reqs[3])
	if !strings.Contains(got, "CHILD failed budget exhausted: tokens 60 of 50 (budget.tokens) budget.tokens") {
		t.Fatalf("the root read %q", got)
	}
	if !strings.Contains(got, "REFUSED refused") || !strings.Contains(got, "agents.max_tree_tokens") {
		t.Fatalf("the second spawn: %q, want refused by agents.max_tree_tokens", got)
	}
	a.eventually("the root waits again", a.state(store.StateWaiting))
	time.Sleep(time.Second)
	if n := model.Count(); n != 4 {
		t.Fatalf("%d model requests, want 4: the exhausted child asked again", n)
	}
	if in := a.jobInputs(); len(in) != 1 {
		t.Fatalf("notifications %q, want one", in)
	}
	cs, err := a.c.Session(t.Context(), "child-1")
	if err != nil || cs.State != store.StateStopped || cs.Attempt == nil || !strings.Contains(cs.Attempt.Outcome, "budget exhausted") {
		t.Fatalf("the child's session %+v, %v", cs, err)
	}
}

var pidRE = regexp.MustCompile(`PID (\d+)`)

// Cancelling a child stops its kernel and cascades: its grandchild's model
// request in flight is cancelled (the scripted server sees its client
// leave), both end cancelled, each parent is told once, the child's
// Python kernel is gone, and nothing asks the model again but the root.
func TestCancelStopsKernelAndCascades(t *testing.T) {
	model := modeltest.New()
	defer model.Close()
	hold, gone := make(chan struct{}), make(chan struct{})
	defer close(hold)
	a := startAgentsAgent(t, model, "")
	// The workspace's own directory takes no new entries from a cell (the
	// data directory lies inside it); a directory under it does.
	out := filepath.Join(filepath.Dir(a.data), "out")
	if err := os.Mkdir(out, 0o777); err != nil {
		t.Fatal(err)
	}
	pidFile := filepath.Join(out, "child.pid")
	model.Then(
		modeltest.Reply{Calls: []modeltest.Call{{ID: "r1", Code: "child = await agents.spawn(task='delegate further')\n" +
			"await runtime.wait(None, reason=f'child {child.id}')"}}},
		// The child: it spawns a grandchild, then keeps its cell busy.
		modeltest.Reply{Calls: []modeltest.Call{{ID: "k1", Code: "import os, asyncio\ng = await agents.spawn(task='think hard')\n" +
			"open(" + strconv.Quote(pidFile) + ", 'w').write(f'PID {os.getpid()}')\nawait asyncio.sleep(120)"}}},
		// The grandchild's request: held until its client leaves.
		modeltest.Reply{Text: "thinking", Hold: hold, Gone: gone},
		modeltest.Reply{Text: "The child was cancelled.", Calls: []modeltest.Call{{ID: "r2", Code: "await runtime.wait(None)"}}},
	)
	a.send("start a tree")
	var pid int
	a.eventually("the grandchild's request is in flight and the child wrote its pid", func() bool {
		b, err := os.ReadFile(pidFile)
		if m := pidRE.FindStringSubmatch(string(b)); err == nil && m != nil {
			pid, _ = strconv.Atoi(m[1])
		}
		return model.Count() == 3 && pid != 0
	})
	if pid == 0 || syscall.Kill(pid, 0) != nil {
		t.Fatalf("the child's kernel pid %d is not alive", pid)
	}
	j, err := a.c.CancelJob(t.Context(), 1)
	if err != nil || j.State != store.JobCancelled {
		t.Fatalf("cancel: %+v, %v", j, err)
	}
	select {
	case <-gone:
	case <-time.After(30 * time.Second):
		t.Fatal("the grandchild's model request was not cancelled")
	}
	if g, err := a.c.Job(t.Context(), 2); err != nil || g.State != store.JobCancelled || !strings.Contains(g.Error, "its parent child-1") {
		t.Fatalf("the grandchild's job %+v, %v", g, err)
	}
	a.eventually("the child's kernel is gone", func() bool { return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) })
	a.eventually("the kernel's stop is recorded", func() bool {
		for _, r := range a.sessionRecords("child-1") {
			if r.Kind == "kernel.reset" {
				return true
			}
		}
		return false
	})
	a.eventually("the root was told", func() bool { return model.Count() == 4 })
	if woke := lastUser(model.Requests()[3]); !strings.HasPrefix(woke, "[klbr] child 1 cancelled") {
		t.Fatalf("the root woke to %q", woke)
	}
	for _, s := range []string{"child-1", "child-2"} {
		if cs, err := a.c.Session(t.Context(), s); err != nil || cs.State != store.StateStopped {
			t.Fatalf("%s: %+v, %v; want stopped", s, cs.Session, err)
		}
	}
	a.eventually("the root waits again", a.state(store.StateWaiting))
	time.Sleep(time.Second)
	if n := model.Count(); n != 4 {
		t.Fatalf("%d model requests, want 4", n)
	}
	if in := a.jobInputs(); len(in) != 1 {
		t.Fatalf("the root's notifications %q, want one", in)
	}
}

// The operator's stop of a parent cancels its running children: none goes
// on spending under a stopped parent.
func TestStopOfAParentCancelsItsChildren(t *testing.T) {
	model := modeltest.New()
	defer model.Close()
	hold, gone := make(chan struct{}), make(chan struct{})
	defer close(hold)
	model.Then(
		modeltest.Reply{Calls: []modeltest.Call{{ID: "r1", Code: "child = await agents.spawn(task='think')\n" +
			"await runtime.wait(None, reason=f'child {child.id}')"}}},
		modeltest.Reply{Text: "thinking", Hold: hold, Gone: gone},
	)
	a := startAgentsAgent(t, model, "")
	a.send("start a child")
	a.eventually("the child's request is in flight", func() bool { return model.Count() == 2 })
	if _, err := a.c.StopSession(t.Context(), "default"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-gone:
	case <-time.After(30 * time.Second):
		t.Fatal("the child's model request was not cancelled")
	}
	if j, err := a.c.Job(t.Context(), 1); err != nil || j.State != store.JobCancelled {
		t.Fatalf("the child's job %+v, %v", j, err)
	}
	time.Sleep(time.Second)
	if n := model.Count(); n != 2 {
		t.Fatalf("%d model requests, want 2", n)
	}
}

// A child past its wall time is ended while it waits, across a restart:
// its deadline is its job's start plus budget.wall_seconds, so the sweep
// at the next start ends it, and the parent is woken once.
func TestWallTimeEndsAWaitingChildAcrossARestart(t *testing.T) {
	model := modeltest.New()
	defer model.Close()
	model.Then(
		modeltest.Reply{Calls: []modeltest.Call{{ID: "r1", Code: "child = await agents.spawn(task='wait forever', budget={'wall_seconds': 4})\n" +
			"await runtime.wait(None, reason=f'child {child.id}')"}}},
		modeltest.Reply{Calls: []modeltest.Call{{ID: "k1", Code: "await runtime.wait(None, reason='nothing to do')"}}},
		modeltest.Reply{Text: "The child timed out.", Calls: []modeltest.Call{{ID: "r2", Code: "await runtime.wait(None)"}}},
	)
	a := startAgentsAgent(t, model, "")
	a.send("start a child that waits")
	a.eventually("the child waits", func() bool {
		cs, err := a.c.Session(t.Context(), "child-1")
		return err == nil && cs.State == store.StateWaiting
	})
	a.kill()
	time.Sleep(4 * time.Second)
	a.start()
	a.eventually("the root was told", func() bool { return model.Count() == 3 })
	if woke := lastUser(model.Requests()[2]); !strings.HasPrefix(woke, "[klbr] child 1 failed (session child-1, budget exhausted). Error: budget exhausted: wall time") ||
		!strings.Contains(woke, "of 4s (budget.wall_seconds)") {
		t.Fatalf("the root woke to %q", woke)
	}
	a.eventually("the root waits again", a.state(store.StateWaiting))
	if in := a.jobInputs(); len(in) != 1 || model.Count() != 3 {
		t.Fatalf("notifications %q, %d requests", in, model.Count())
	}
	if cs, err := a.c.Session(t.Context(), "child-1"); err != nil || cs.State != store.StateStopped {
		t.Fatalf("the child's session %+v, %v", cs.Session, err)
	}
}

// With model_slots = 2, a child in a model request holds the one slot
// children may take; its sibling waits for a slot, visibly (its status
// and /metrics), and the root still answers the operator at once.
func TestRootAnswersWhileChildrenHoldTheirSlots(t *testing.T) {
	model := modeltest.New()
	defer model.Close()
	hold := make(chan struct{})
	defer close(hold)
	model.Then(
		modeltest.Reply{Calls: []modeltest.Call{{ID: "r1", Code: "a = await agents.spawn(task='first')\nb = await agents.spawn(task='second')\n" +
			"await runtime.wait(None, reason='children')"}}},
		modeltest.Reply{Text: "thinking", Hold: hold}, // one child's request: it holds the children's slot
		modeltest.Reply{Text: "I am here.", Calls: []modeltest.Call{{ID: "r2", Code: "await local.send('here')\nawait runtime.wait(None)"}}},
	)
	a := startAgentsAgent(t, model, "[agents]\nmodel_slots = 2\n")
	a.send("spawn two")
	a.eventually("a child holds the slot and its sibling waits for one", func() bool {
		return model.Count() == 2 && strings.Contains(a.scrape(), `klbr_model_slots_waiting{holder="child"} 1`)
	})
	var waiting string
	for _, s := range []string{"child-1", "child-2"} {
		if cs, err := a.c.Session(t.Context(), s); err == nil && cs.Retry != nil && cs.Retry.State == "waiting_for_slot" {
			waiting = s
		}
	}
	if waiting == "" {
		t.Fatal("no child's status says it waits for a slot")
	}
	a.send("are you there?")
	a.eventually("the root answered", func() bool { return model.Count() == 3 })
	if got := lastUser(model.Requests()[2]); !strings.Contains(got, "are you there?") {
		t.Fatalf("the third request is not the root's: %q", got)
	}
	m := a.scrape()
	for _, want := range []string{`klbr_model_slots 2`, `klbr_model_slots_in_use{holder="child"} 1`, `klbr_model_slots_waiting{holder="child"} 1`} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}
