package jobs

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/config"
	"github.com/klbr-dev/klbr/internal/hosts"
	"github.com/klbr-dev/klbr/internal/hosttest"
	"github.com/klbr-dev/klbr/internal/store"
)

// A remote job outlives the klbr-core that dispatched it: stopping the
// manager leaves its unit running on the host, and the next start
// reattaches to the unit (waits on it, never starts it again) and records
// its end once. A unit that is gone when klbr-core comes back goes by the
// recovery policy: manual ends unknown.
func TestRemoteJobReattach(t *testing.T) {
	h := hosttest.Start(t)
	h.InstallKernel(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	tg, err := config.ParseSSHTarget(h.SSH())
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if st, err := store.Open(ctx, dir, store.Options{}); err != nil {
		t.Fatal(err)
	} else {
		if err := st.Write(ctx, func(tx *store.Tx) error { _, err := tx.EnsureSession("default"); return err }); err != nil {
			t.Fatal(err)
		}
		st.Close()
	}
	// core is one klbr-core's worth of jobs: its own store handle, SSH
	// connection and manager, over the same data directory.
	type core struct {
		st  *store.Store
		eng *hosts.Engine
		m   *Manager
	}
	start := func() *core {
		t.Helper()
		eng, err := hosts.New(hosts.Config{ConnectTimeout: 2 * time.Second, Hosts: map[string]hosts.Host{"lab": {
			Name: "lab", Target: tg, IdentityFile: h.IdentityFile, KnownHostsFile: h.KnownHostsFile,
			MaxJobs: 4, MemoryMaxBytes: 64 << 20, TasksMax: 64, CPUQuotaPct: 100, Wall: time.Hour, WorkDir: h.WorkDir}}})
		if err != nil {
			t.Fatal(err)
		}
		st, err := store.Open(ctx, dir, store.Options{})
		if err != nil {
			t.Fatal(err)
		}
		m := New(Config{Store: st, Workspace: t.TempDir(), Hosts: eng, HostPoll: 50 * time.Millisecond})
		if err := m.Start(ctx); err != nil {
			t.Fatal(err)
		}
		return &core{st: st, eng: eng, m: m}
	}
	stop := func(c *core) {
		c.m.Close()
		c.eng.Close()
		c.st.Close()
	}
	// Each start of the command says "started" to a listener of the test
	// across the host's link: one line is one start, ever. (A confined job
	// writes no file outside its own directory, and its /dev/shm is its
	// own; its network is the host's.)
	seen := startsListener(t, h.Gw)
	mark := "echo started > /dev/tcp/" + seen.host + "/" + seen.port
	untilActive := func(unit string) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); ; {
			if out, _ := h.Enter("systemctl", "is-active", unit).Output(); strings.TrimSpace(string(out)) == "active" {
				if seen.String() != "" {
					return
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s never ran", unit)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	t.Run("stopped and started again: reattached, finished, recorded once, started once", func(t *testing.T) {
		seen.Reset()
		c := start()
		j, err := c.m.Run(ctx, RunRequest{Session: "default", Spec: CommandSpec{Host: "lab",
			Argv: []string{"bash", "-c", mark + "; sleep 2; echo finished"}}})
		if err != nil {
			t.Fatal(err)
		}
		unit := UnitName(j.ID, 1)
		untilActive(unit)
		stop(c)
		if out, _ := h.Enter("systemctl", "is-active", unit).Output(); strings.TrimSpace(string(out)) != "active" {
			t.Fatalf("stopping klbr-core stopped the job's unit: %s", out)
		}
		c = start()
		defer stop(c)
		if got, _ := c.st.Job(ctx, j.ID); got.State != store.JobRunning || got.Host != "lab" {
			t.Fatalf("after the restart: %s on %q, want running on lab", got.State, got.Host)
		}
		j, err = c.m.Wait(ctx, j.ID, 0, 60*time.Second)
		if err != nil || j.State != store.JobSucceeded || strings.TrimSpace(j.OutputPreview) != "started\nfinished" && strings.TrimSpace(j.OutputPreview) != "finished" || j.Runs != 1 {
			t.Fatalf("job %s %q runs %d, output %q (%v)", j.State, j.Error, j.Runs, j.OutputPreview, err)
		}
		if b := seen.String(); b != "started\n" {
			t.Fatalf("the command started %d times: %q", strings.Count(b, "started"), b)
		}
		notices := 0
		page, err := c.st.Records(ctx, "default", 0, 1000)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range page {
			if r.Kind == "job.input" {
				notices++
			}
		}
		if notices != 1 {
			t.Fatalf("%d job notices, want 1", notices)
		}
		if units, _ := h.Units("klbr-job-*"); len(units) != 0 {
			t.Fatalf("units left on the host: %v", units)
		}
	})

	t.Run("a unit gone when klbr-core comes back: manual ends unknown, not run again", func(t *testing.T) {
		seen.Reset()
		c := start()
		j, err := c.m.Run(ctx, RunRequest{Session: "default", Spec: CommandSpec{Host: "lab",
			Argv: []string{"bash", "-c", mark + "; sleep 1000"}}})
		if err != nil {
			t.Fatal(err)
		}
		unit := UnitName(j.ID, 1)
		untilActive(unit)
		stop(c)
		// The host rebooted meanwhile: the unit is gone.
		if out, err := h.Enter("systemctl", "stop", unit).CombinedOutput(); err != nil {
			t.Fatalf("stop: %v %s", err, out)
		}
		h.Enter("systemctl", "reset-failed", unit).Run()
		c = start()
		defer stop(c)
		j, err = c.m.Wait(ctx, j.ID, 0, 60*time.Second)
		if err != nil || j.State != store.JobUnknown || !strings.Contains(j.Error, "is gone from host lab") || j.Runs != 1 {
			t.Fatalf("job %s %q runs %d (%v); want unknown, its unit gone", j.State, j.Error, j.Runs, err)
		}
		if b := seen.String(); b != "started\n" {
			t.Fatalf("the command started %d times", strings.Count(b, "started"))
		}
	})
}
