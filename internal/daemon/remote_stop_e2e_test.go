package daemon

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/hosttest"
	"github.com/klbr-dev/klbr/internal/modeltest"
	"github.com/klbr-dev/klbr/internal/store"
)

// `klbr-core stop` stops the workers of sessions on a host but leaves its
// jobs to finish, as locally: the root's workbench runs on the lab host
// and has started a job there; after the drain the workbench's unit is
// gone from the host while the job's unit still runs; the next start
// reattaches the job (never starting it again) and it ends with its
// output.
func TestStopLeavesRemoteJobsAndStopsRemoteWorkers(t *testing.T) {
	h := hosttest.Start(t)
	h.InstallKernel(t)
	// The job may write only its own directory there (Landlock), and sees
	// neither the host's /tmp nor its /dev/shm: the gate is made in its
	// directory too.
	dir := filepath.Join(h.WorkDir, "klbr-job-1-1.service")
	gate, started := filepath.Join(dir, "gate"), filepath.Join(dir, "started")
	model := modeltest.New()
	defer model.Close()
	model.Then(
		modeltest.Reply{Calls: []modeltest.Call{{ID: "c1", Code: fmt.Sprintf("j = await jobs.run(['sh', '-c', %q], host='lab')\n"+
			"await runtime.wait(None)", "echo run; echo run >> started; while [ ! -e gate ]; do sleep 0.1; done; echo done")}}},
	)
	model.Otherwise(func(int) modeltest.Reply {
		return modeltest.Reply{Calls: []modeltest.Call{{Code: "await runtime.wait(None)"}}}
	})
	hostTOML := fmt.Sprintf("[hosts.lab]\nssh = %q\nidentity_file = %q\nknown_hosts_file = %q\nwork_dir = %q\nmanager = %q\n",
		h.SSH(), h.IdentityFile, h.KnownHostsFile, h.WorkDir, h.Manager)
	a := startAgentTOML(t, "", route("main", model, "")+hostTOML, "KLBR_REMOTE_PLACEMENT=lab")
	a.send("start it")
	a.eventually("the job runs on the host", func() bool {
		b, _ := os.ReadFile(started)
		return string(b) == "run\n"
	})
	units := func(pattern string) []string {
		t.Helper()
		u, err := h.Units(pattern)
		if err != nil {
			t.Fatal(err)
		}
		return u
	}
	if wb := units("klbr-workbench-*"); len(wb) != 1 {
		t.Fatalf("workbench units on the host before the stop: %v", wb)
	}
	if _, err := a.c.Stop(t.Context()); err != nil {
		t.Fatal(err)
	}
	a.d.wait(t)
	deadline := time.Now().Add(30 * time.Second)
	for len(units("klbr-workbench-*")) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the workbench's unit outlived klbr-core stop: %v\n%s", units("klbr-workbench-*"), a.d)
		}
		time.Sleep(100 * time.Millisecond)
	}
	jobUnits := units("klbr-job-*")
	if len(jobUnits) != 1 || jobUnits[0] != "klbr-job-1-1.service" {
		t.Fatalf("job units on the host after the stop: %v; want klbr-job-1-1.service, running on", jobUnits)
	}
	if out, err := h.Enter("systemctl", "is-active", jobUnits[0]).Output(); strings.TrimSpace(string(out)) != "active" {
		t.Fatalf("the job's unit after the stop: %q %v; want active", out, err)
	}
	a.start()
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	a.eventually("the job ends after the restart", func() bool {
		j, err := a.c.Job(t.Context(), 1)
		return err == nil && j.State.Final()
	})
	j, _ := a.c.Job(t.Context(), 1)
	if j.State != store.JobSucceeded || strings.TrimSpace(j.OutputPreview) != "run\ndone" || j.Runs != 1 {
		t.Fatalf("job %s %q runs %d output %q; want succeeded after one run", j.State, j.Error, j.Runs, j.OutputPreview)
	}
}
