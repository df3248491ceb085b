package daemon

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/modeltest"
	"github.com/klbr-dev/klbr/internal/store"
)

// e2eJobs is a module of the test release: it lives only in the behavior
// tree the daemon publishes, so a routine that imports it proves the worker
// ran from the pinned release.
const e2eJobs = `def remind(input):
    return {"reminder": input["text"]}
`

// startJobsAgent starts klbr-core on a behavior tree that holds e2eJobs.
func startJobsAgent(t *testing.T, model *modeltest.Server) *agent {
	t.Helper()
	return startAgentWithTree(t, model, "", map[string]string{"klbr_skills/e2e_jobs.py": e2eJobs})
}

// startAgentWithTree starts klbr-core with toml added to klbr.toml, on a
// copy of the shipped behavior tree with files (a path in the tree: its
// text) written into it.
func startAgentWithTree(t *testing.T, model *modeltest.Server, toml string, files map[string]string) *agent {
	t.Helper()
	requirePython(t)
	tree := filepath.Join(t.TempDir(), "behavior")
	if err := os.CopyFS(tree, os.DirFS("../../behavior")); err != nil {
		t.Fatal(err)
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(tree, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	data, env := instance(t)
	return startAgentAt(t, model, toml, "", data, append(env, "KLBR_BEHAVIOR_DIR="+tree))
}

// jobInputs are the job notifications admitted to the default session.
func (a *agent) jobInputs() []string {
	var out []string
	for _, r := range a.kinds(store.LaneInput, "job.input") {
		var c struct{ Text string }
		json.Unmarshal(r.Content, &c)
		out = append(out, c.Text)
	}
	return out
}

func lastUser(req modeltest.Request) string {
	for i := len(req.Messages) - 1; i >= 0; i-- {
		if req.Messages[i]["role"] == "user" {
			return content(req.Messages[i])
		}
	}
	return ""
}

// The agent schedules a reminder, waits, and is woken by it once.
func TestReminderWakesTheAgentOnce(t *testing.T) {
	model := modeltest.New()
	defer model.Close()
	model.Then(
		modeltest.Reply{Calls: []modeltest.Call{{ID: "c1", Code: "import time\n" +
			"j = await jobs.schedule('klbr_skills.e2e_jobs:remind', at=time.time() + 1.5, input={'text': 'stretch'})\n" +
			"await runtime.wait(None, reason=f'reminder job {j.id}')"}}},
		modeltest.Reply{Text: "Time to stretch.", Calls: []modeltest.Call{{ID: "c2", Code: "await runtime.wait(None)"}}},
	)
	a := startJobsAgent(t, model)
	a.send("remind me to stretch")
	a.eventually("woken by the reminder", func() bool { return model.Count() == 2 })
	woke := lastUser(model.Requests()[1])
	if !strings.HasPrefix(woke, "[klbr] job 1 succeeded") || !strings.Contains(woke, "stretch") {
		t.Fatalf("the woken step saw %q", woke)
	}
	a.eventually("waiting again", a.state(store.StateWaiting))
	time.Sleep(time.Second)
	if n := model.Count(); n != 2 {
		t.Fatalf("%d model requests, want 2: the reminder woke the agent more than once", n)
	}
	if in := a.jobInputs(); len(in) != 1 {
		t.Fatalf("job notifications %q, want one", in)
	}
	j, err := a.c.Job(t.Context(), 1)
	if err != nil || j.State != store.JobSucceeded || string(j.Result) != `{"reminder":"stretch"}` || j.Runs != 1 {
		t.Fatalf("job %+v, %v", j, err)
	}
	if m := a.scrape(); !strings.Contains(m, `klbr_jobs{kind="routine",state="succeeded"} 1`) {
		t.Fatalf("metrics lack the succeeded routine:\n%s", grepLines(m, "klbr_jobs"))
	}
}

// A tracked command outlives a kernel reset; its completion wakes the
// waiting agent with one notification, and jobs.get in the new generation
// reads its result from the record.
func TestCommandSurvivesKernelReset(t *testing.T) {
	model := modeltest.New()
	defer model.Close()
	model.Then(
		modeltest.Reply{Calls: []modeltest.Call{{ID: "c1", Code: "j = await jobs.run(['sh', '-c', 'sleep 2; echo built'])\n" +
			"await runtime.wait(None, reason=f'build job {j.id}')"}}},
		modeltest.Reply{Calls: []modeltest.Call{{ID: "c2", Code: "j = await jobs.get(1)\nprint('JOB', j.state, j.result_value['exit_code'], j.output_preview.strip())"}}},
		modeltest.Reply{Text: "Built.", Calls: []modeltest.Call{{ID: "c3", Code: "await runtime.wait(None)"}}},
	)
	a := startJobsAgent(t, model)
	a.send("build it")
	a.eventually("waiting on the build", a.state(store.StateWaiting))
	before := a.session().KernelGen
	if _, err := a.c.Reset(t.Context(), "default", "test: kernel reset during the build", true); err != nil {
		t.Fatal(err)
	}
	if j, _ := a.c.Job(t.Context(), 1); j.State != store.JobRunning {
		t.Fatalf("after the kernel reset the job is %s, want running", j.State)
	}
	a.eventually("woken by the build", func() bool { return model.Count() >= 2 })
	if woke := lastUser(model.Requests()[1]); !strings.HasPrefix(woke, "[klbr] job 1 succeeded") || !strings.Contains(woke, "built") {
		t.Fatalf("the woken step saw %q", woke)
	}
	a.eventually("the result read in the new generation", func() bool { return model.Count() == 3 })
	m := model.Requests()[2].Messages
	if got := content(m[len(m)-1]); !strings.Contains(got, "JOB succeeded 0 built") {
		t.Fatalf("jobs.get in the new generation: %q", got)
	}
	if after := a.session().KernelGen; after <= before {
		t.Fatalf("kernel generation %d → %d: no new generation", before, after)
	}
	if in := a.jobInputs(); len(in) != 1 {
		t.Fatalf("job notifications %q, want one", in)
	}
}

// A scheduled routine fires once after klbr-core is SIGKILLed before its
// deadline and restarted after it.
func TestRoutineFiresOnceAfterKillAcrossItsDeadline(t *testing.T) {
	model := modeltest.New()
	defer model.Close()
	model.Then(
		modeltest.Reply{Calls: []modeltest.Call{{ID: "c1", Code: "import time\n" +
			"j = await jobs.schedule('klbr_skills.e2e_jobs:remind', at=time.time() + 2, input={'text': 'later'})\n" +
			"await runtime.wait(None)"}}},
		modeltest.Reply{Text: "Noted.", Calls: []modeltest.Call{{ID: "c2", Code: "await runtime.wait(None)"}}},
	)
	a := startJobsAgent(t, model)
	a.send("schedule it")
	a.eventually("waiting", a.state(store.StateWaiting))
	a.kill()
	time.Sleep(3 * time.Second) // the deadline passes while klbr-core is down
	a.start()
	a.eventually("woken by the routine", func() bool { return model.Count() == 2 })
	time.Sleep(time.Second)
	j, err := a.c.Job(t.Context(), 1)
	if err != nil || j.State != store.JobSucceeded || j.Runs != 1 {
		t.Fatalf("job %+v, %v; want succeeded after one run", j, err)
	}
	if in := a.jobInputs(); len(in) != 1 || model.Count() != 2 {
		t.Fatalf("notifications %q, %d model requests", in, model.Count())
	}
}

// After klbr-core stop, no process a job started remains; a manual command
// that was running is unknown after the restart and was not run again.
func TestStopKillsJobTreesAndManualCommandIsUnknown(t *testing.T) {
	model := modeltest.New()
	defer model.Close()
	model.Then(
		modeltest.Reply{Calls: []modeltest.Call{{ID: "c1", Code: "import os\n" +
			"j = await jobs.run(['sh', '-c', 'echo run >> runs.txt; sleep 300 & echo $! > job.pid; wait'], cwd='work')\n" +
			"await runtime.wait(None)"}}},
		modeltest.Reply{Text: "I will check.", Calls: []modeltest.Call{{ID: "c2", Code: "await runtime.wait(None)"}}},
	)
	a := startJobsAgent(t, model)
	// The workspace (see instance) holds the data directory, where Landlock lets cells
	// make no new entries: the command works in a directory of its own.
	ws := filepath.Join(filepath.Dir(a.data), "work")
	if err := os.Mkdir(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	a.send("start it")
	var pid int
	a.eventually("the job's grandchild runs", func() bool {
		b, err := os.ReadFile(filepath.Join(ws, "job.pid"))
		if err != nil || !strings.HasSuffix(string(b), "\n") {
			return false
		}
		pid = atoi(strings.TrimSpace(string(b)))
		return pid > 0
	})
	st, err := a.c.Status(t.Context())
	if err != nil || st.Jobs == nil || len(st.Jobs.Running) != 1 {
		t.Fatalf("status jobs %+v, %v; want one running", st.Jobs, err)
	}
	if _, err := a.c.Stop(t.Context()); err != nil {
		t.Fatal(err)
	}
	a.d.wait(t)
	if syscall.Kill(pid, 0) == nil {
		t.Fatalf("process %d started by a job outlived klbr-core stop", pid)
	}
	a.start()
	a.eventually("told the command is unknown", func() bool { return model.Count() == 2 })
	if woke := lastUser(model.Requests()[1]); !strings.Contains(woke, "unknown") || !strings.Contains(woke, "not run again") {
		t.Fatalf("the notice: %q", woke)
	}
	j, _ := a.c.Job(t.Context(), 1)
	if j.State != store.JobUnknown {
		t.Fatalf("job is %s, want unknown", j.State)
	}
	time.Sleep(500 * time.Millisecond)
	if b, _ := os.ReadFile(filepath.Join(ws, "runs.txt")); string(b) != "run\n" {
		t.Fatalf("the command ran %q", b)
	}
}

func atoi(s string) int {
	n := 0
	for _, c := range s {
		if c < '0' || c > '9' {
			return 0
		}
		n = n*10 + int(c-'0')
	}
	return n
}
