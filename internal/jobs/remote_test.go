package jobs

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/config"
	"github.com/klbr-dev/klbr/internal/hosts"
	"github.com/klbr-dev/klbr/internal/hosttest"
	"github.com/klbr-dev/klbr/internal/store"
)

// Jobs with host= run as transient units of a second host's systemd,
// reached only by SSH (package hosttest boots it).
func TestRemoteJobs(t *testing.T) {
	h := hosttest.Start(t)
	h.InstallKernel(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	tg, err := config.ParseSSHTarget(h.SSH())
	if err != nil {
		t.Fatal(err)
	}
	eng, err := hosts.New(hosts.Config{ConnectTimeout: 2 * time.Second, Hosts: map[string]hosts.Host{"lab": {
		Name: "lab", Target: tg, IdentityFile: h.IdentityFile, KnownHostsFile: h.KnownHostsFile, Labels: []string{"big"},
		MaxJobs: 4, MemoryMaxBytes: 64 << 20, TasksMax: 64, CPUQuotaPct: 100, Wall: time.Hour, WorkDir: h.WorkDir}}})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	st, err := store.Open(ctx, t.TempDir(), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.Write(ctx, func(tx *store.Tx) error { _, err := tx.EnsureSession("default"); return err }); err != nil {
		t.Fatal(err)
	}
	m := New(Config{Store: st, Workspace: t.TempDir(), Hosts: eng, HostPoll: 50 * time.Millisecond})
	if err := m.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	run := func(host string, argv ...string) store.Job {
		t.Helper()
		j, err := m.Run(ctx, RunRequest{Session: "default", Spec: CommandSpec{Argv: argv, Host: host}})
		if err != nil {
			t.Fatal(err)
		}
		return j
	}
	wait := func(j store.Job) store.Job {
		t.Helper()
		j, err := m.Wait(ctx, j.ID, 0, 60*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return j
	}
	netns, err := h.NetNS()
	if err != nil {
		t.Fatal(err)
	}

	t.Run("an unreachable host leaves the job pending with the reason, and it runs once the host is back", func(t *testing.T) {
		h.SetLink(t, false)
		j := run("lab", "readlink", "/proc/self/ns/net")
		for {
			j, _ = m.cfg.Store.Job(ctx, j.ID)
			if j.State == store.JobPending && j.Runs > 0 {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if !strings.Contains(j.Error, "host lab: host unreachable") || !strings.Contains(j.Error, "trying again at") {
			t.Fatalf("pending job's reason %q, want the host unreachable and when it tries again", j.Error)
		}
		h.SetLink(t, true)
		j = wait(j)
		if j.State != store.JobSucceeded || strings.TrimSpace(j.OutputPreview) != netns {
			t.Fatalf("job %s %q, output %q; want it run on the host (%s)", j.State, j.Error, j.OutputPreview, netns)
		}
	})

	t.Run("a job runs on the host and says where", func(t *testing.T) {
		j := wait(run("label:big", "sh", "-c", "readlink /proc/self/ns/net; exit 3"))
		if j.State != store.JobFailed || j.Error != "exit status 3 (on host lab)" || strings.TrimSpace(j.OutputPreview) != netns {
			t.Fatalf("job %s %q, output %q", j.State, j.Error, j.OutputPreview)
		}
		var res struct {
			ExitCode int    `json:"exit_code"`
			Host     string `json:"host"`
			Unit     string `json:"unit"`
		}
		if err := json.Unmarshal(j.Result, &res); err != nil || res.ExitCode != 3 || res.Host != "lab" || res.Unit != UnitName(j.ID, j.Runs) {
			t.Fatalf("result %s (%v)", j.Result, err)
		}
		if !strings.Contains(describe(j), " on label:big") {
			t.Fatalf("describe: %q", describe(j))
		}
		if units, _ := h.Units("klbr-job-*"); len(units) != 0 {
			t.Fatalf("units left on the host: %v", units)
		}
	})

	t.Run("a memory hog is killed by the host's systemd", func(t *testing.T) {
		j := wait(run("lab", "python3", "-c", "b = []\nwhile True: b.append(bytearray(16 << 20))"))
		if j.State != store.JobFailed || !strings.Contains(j.Error, "killed") {
			t.Fatalf("job %s %q, want failed, killed under MemoryMax", j.State, j.Error)
		}
	})

	t.Run("cancel stops the unit and every process of it", func(t *testing.T) {
		j := run("lab", "sh", "-c", "sleep 1003 & sleep 1004; wait")
		for deadline := time.Now().Add(30 * time.Second); ; {
			out, _ := h.Enter("pgrep", "-f", "sleep 100[34]").Output()
			if len(strings.Fields(string(out))) >= 3 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the job's processes never showed on the host")
			}
			time.Sleep(50 * time.Millisecond)
		}
		j, err := m.Cancel(ctx, j.ID)
		if err != nil || j.State != store.JobCancelled {
			t.Fatalf("cancel: %s %q %v", j.State, j.Error, err)
		}
		if out, err := h.Enter("pgrep", "-f", "sleep 100[34]").Output(); err == nil {
			t.Fatalf("processes of the cancelled job remain on the host: %s", out)
		}
	})

	t.Run("refused at once", func(t *testing.T) {
		for _, host := range []string{"nowhere", "label:gpu"} {
			if _, err := m.Run(ctx, RunRequest{Session: "default", Spec: CommandSpec{Argv: []string{"true"}, Host: host}}); err == nil ||
				!strings.Contains(err.Error(), "no such host") {
				t.Fatalf("host=%q: %v, want no such host", host, err)
			}
		}
	})

	if n, err := h.Accepted(); err != nil || n != 1 {
		t.Fatalf("sshd accepted %d connections (%v) for every job; want 1", n, err)
	}
}
