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

// The link of a host goes down while a job of the agent runs there:
// status says the host is down since when and the job waits for it and
// what ends the wait; /metrics has klbr_host_up 0; `klbr-core hosts` finds
// it unreachable. The link comes back: the job's unit is reattached, not
// started again, the job ends with its output, and the agent is woken once.
func TestRemoteJobWhileItsHostIsDown(t *testing.T) {
	h := hosttest.Start(t)
	h.InstallKernel(t) // every job on a host runs under it
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
		modeltest.Reply{Calls: []modeltest.Call{{ID: "c2", Code: "await runtime.wait(None)"}}},
	)
	hostTOML := fmt.Sprintf("[hosts.lab]\nssh = %q\nidentity_file = %q\nknown_hosts_file = %q\nwork_dir = %q\nmanager = %q\n",
		h.SSH(), h.IdentityFile, h.KnownHostsFile, h.WorkDir, h.Manager)
	a := startAgentTOML(t, "", route("main", model, "")+hostTOML)
	a.send("start it")
	a.eventually("the job runs on the host", func() bool {
		b, _ := os.ReadFile(started)
		return string(b) == "run\n"
	})
	h.SetLink(t, false)
	t.Cleanup(func() { h.SetLink(t, true) })
	var note string
	deadline := time.Now().Add(2 * time.Minute) // the connection is given up after ServerAlive's 15 s
	for {
		st, err := a.c.Status(t.Context())
		if err == nil && st.Jobs != nil && len(st.Jobs.Hosts) == 1 && !st.Jobs.Hosts[0].Up && st.Jobs.Hosts[0].DownSince != nil &&
			len(st.Jobs.Running) == 1 && strings.Contains(st.Jobs.Running[0].Error, "waiting for host lab") {
			note = st.Jobs.Running[0].Error
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("status does not say the host is down and the job waits: %+v %v\n%s", st.Jobs, err, a.d)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !strings.Contains(note, "its unit is reattached when the host answers") || !strings.Contains(note, "the job is unknown, not run again (recovery manual)") {
		t.Fatalf("the job's note does not say what ends the wait: %q", note)
	}
	if m := a.scrape(); !strings.Contains(m, `klbr_host_up{host="lab"} 0`) {
		t.Fatalf("/metrics does not say the host is down:\n%s", m)
	}
	if r, err := a.c.Hosts(t.Context()); err != nil || len(r.Hosts) != 1 || r.Hosts[0].Reachable {
		t.Fatalf("klbr-core hosts: %+v %v; want lab unreachable", r, err)
	}
	h.SetLink(t, true)
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(2 * time.Minute)
	for {
		j, err := a.c.Job(t.Context(), 1)
		if err == nil && j.State.Final() {
			if j.State != store.JobSucceeded || strings.TrimSpace(j.OutputPreview) != "run\ndone" || j.Runs != 1 {
				t.Fatalf("job %s %q runs %d output %q; want succeeded after one run", j.State, j.Error, j.Runs, j.OutputPreview)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the job did not end after the link came back: %+v %v\n%s", j, err, a.d)
		}
		time.Sleep(50 * time.Millisecond)
	}
	a.eventually("the agent is woken by the job's end", func() bool { return model.Count() == 2 })
	if m := a.scrape(); !strings.Contains(m, `klbr_host_up{host="lab"} 1`) {
		t.Fatalf("/metrics does not say the host is up again")
	}
	if in := a.jobInputs(); len(in) != 1 {
		t.Fatalf("job notifications %q, want one", in)
	}
}
