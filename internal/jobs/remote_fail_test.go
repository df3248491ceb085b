package jobs

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/citest"
	"github.com/klbr-dev/klbr/internal/config"
	"github.com/klbr-dev/klbr/internal/hosts"
	"github.com/klbr-dev/klbr/internal/hosttest"
	"github.com/klbr-dev/klbr/internal/store"
)

// labManager is a manager over a fresh store whose hosts are those of
// hs (their Target, keys and work directory filled in from h).
func labManager(t *testing.T, h *hosttest.Host, hs map[string]hosts.Host) (*Manager, *hosts.Engine) {
	t.Helper()
	h.InstallKernel(t) // every job on a host runs under it
	tg, err := config.ParseSSHTarget(h.SSH())
	if err != nil {
		t.Fatal(err)
	}
	for name, x := range hs {
		if x.Target.Host == "" {
			x.Target = tg
		}
		x.Name, x.IdentityFile, x.KnownHostsFile, x.WorkDir = name, h.IdentityFile, h.KnownHostsFile, h.WorkDir
		x.MemoryMaxBytes, x.TasksMax, x.CPUQuotaPct, x.Wall = 64<<20, 64, 100, time.Hour
		hs[name] = x
	}
	log := slog.New(slog.NewTextHandler(tlog{t}, nil))
	eng, err := hosts.New(hosts.Config{ConnectTimeout: 2 * time.Second, Hosts: hs, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(eng.Close)
	st, err := store.Open(t.Context(), t.TempDir(), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if err := st.Write(t.Context(), func(tx *store.Tx) error { _, err := tx.EnsureSession("default"); return err }); err != nil {
		t.Fatal(err)
	}
	m := New(Config{Store: st, Workspace: t.TempDir(), Hosts: eng, HostPoll: 50 * time.Millisecond, Log: log})
	if err := m.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close) // before the engine and the store (cleanups run last first)
	return m, eng
}

// tlog writes a log to the test's.
type tlog struct{ t *testing.T }

func (w tlog) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// poll waits until cond holds, failing after limit.
func poll(t *testing.T, what string, limit time.Duration, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(limit); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, limit)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The host's link goes down while its job runs: the job stays running and
// says it waits for the host, since when, and what ends the wait; the host
// is down. The link comes back: the unit is reattached (never started
// again) and the job ends with its outcome. A host that does not come back
// within its down_grace_seconds ends the job unknown under recovery manual,
// not run again.
func TestRemoteJobWhileTheLinkIsDown(t *testing.T) {
	h := hosttest.Start(t)
	starts := startsListener(t, h.Gw)
	m, eng := labManager(t, h, map[string]hosts.Host{"lab": {MaxJobs: 4}})
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	run := func(m *Manager, argv ...string) store.Job {
		t.Helper()
		j, err := m.Run(ctx, RunRequest{Session: "default", Spec: CommandSpec{Argv: argv, Host: "lab"}})
		if err != nil {
			t.Fatal(err)
		}
		return j
	}
	running := func(m *Manager, id int64) store.Job {
		for _, j := range m.Running() {
			if j.ID == id {
				return j
			}
		}
		return store.Job{}
	}

	t.Run("reattached when the link is back", func(t *testing.T) {
		// The command waits for a file the test makes once the link is
		// back: it runs all the while the host is away.
		// The gate is made in the unit's own directory, its working
		// directory: a confined job sees neither the host's /tmp nor its
		// /dev/shm.
		j := run(m, "sh", "-c", markStart(starts)+"; echo before; while [ ! -e gate ]; do sleep 0.1; done; echo after; exit 4")
		gate := filepath.Join(h.WorkDir, UnitName(j.ID, 1), "gate")
		unit := strings.TrimSuffix(UnitName(j.ID, 1), ".service")
		poll(t, "the unit runs", time.Minute, func() bool { return startsOf(t, starts)[unit] == 1 })
		h.SetLink(t, false)
		t.Cleanup(func() { h.SetLink(t, true) })
		var note string
		poll(t, "the job says it waits for its host", 2*time.Minute, func() bool {
			note = running(m, j.ID).Error
			return strings.Contains(note, "waiting for host lab, down since")
		})
		t.Logf("running job: %s", note)
		if !strings.Contains(note, "its unit is reattached when the host answers") || !strings.Contains(note, "(its wall time), the job is unknown, not run again (recovery manual)") {
			t.Fatalf("the note %q does not say what ends the wait", note)
		}
		if s := eng.Statuses()[0]; s.Up || s.LastErr == "" {
			t.Fatalf("host status %+v, want down with the reason", s)
		}
		poll(t, "the stored job says it too", time.Minute, func() bool {
			got, _ := m.cfg.Store.Job(ctx, j.ID)
			return got.State == store.JobRunning && got.Error == note
		})
		h.SetLink(t, true)
		if err := os.WriteFile(gate, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := m.Wait(ctx, j.ID, 0, 2*time.Minute)
		if err != nil || got.State != store.JobFailed || got.Error != "exit status 4 (on host lab)" || strings.TrimSpace(got.OutputPreview) != "before\nafter" || got.Runs != 1 {
			t.Fatalf("job %s %q runs %d, output %q (%v); want its real end", got.State, got.Error, got.Runs, got.OutputPreview, err)
		}
		if n := startsOf(t, starts)[unit]; n != 1 {
			t.Fatalf("%s started %d times", unit, n)
		}
		if s := eng.Statuses()[0]; !s.Up {
			t.Fatalf("host status %+v, want up", s)
		}
	})

	t.Run("a host that does not come back: unknown under manual after its grace", func(t *testing.T) {
		m, _ := labManager(t, h, map[string]hosts.Host{"lab": {MaxJobs: 4, DownGrace: 3 * time.Second}})
		starts := startsListener(t, h.Gw) // this manager's job ids start at 1 again
		j := run(m, "sh", "-c", markStart(starts)+"; sleep 1009")
		unit := strings.TrimSuffix(UnitName(j.ID, 1), ".service")
		poll(t, "the unit runs", time.Minute, func() bool { return startsOf(t, starts)[unit] == 1 })
		h.SetLink(t, false)
		t.Cleanup(func() { h.SetLink(t, true) })
		poll(t, "the job says when its wait ends", 2*time.Minute, func() bool {
			return strings.Contains(running(m, j.ID).Error, "(its down_grace_seconds), the job is unknown, not run again (recovery manual)")
		})
		got, err := m.Wait(ctx, j.ID, 0, 2*time.Minute)
		h.SetLink(t, true)
		if err != nil || got.State != store.JobUnknown || !strings.Contains(got.Error, "host lab did not answer for 3s (its down_grace_seconds)") ||
			!strings.Contains(got.Error, "not run again") || got.Runs != 1 {
			t.Fatalf("job %s %q runs %d (%v); want unknown after the grace", got.State, got.Error, got.Runs, err)
		}
		if n := startsOf(t, starts)[unit]; n != 1 {
			t.Fatalf("%s started %d times", unit, n)
		}
		_ = eng.Collect(ctx, "lab", UnitName(j.ID, 1))
	})

	t.Run("unreachable at dispatch: a job with a label moves to another host with it", func(t *testing.T) {
		// "dead" is the lab's address on a port nothing listens on: its
		// connect fails at once. It has more room, so it is tried first.
		dead := hosts.Host{MaxJobs: 8, Labels: []string{"big"}}
		dead.Target, _ = config.ParseSSHTarget(h.User + "@" + h.Addr + ":2223")
		m, eng := labManager(t, h, map[string]hosts.Host{"dead": dead, "lab": {MaxJobs: 4, Labels: []string{"big"}}})
		j, err := m.Run(ctx, RunRequest{Session: "default", Spec: CommandSpec{Argv: []string{"true"}, Host: "label:big"}})
		if err != nil {
			t.Fatal(err)
		}
		got, err := m.Wait(ctx, j.ID, 0, 2*time.Minute)
		var res struct {
			Host string `json:"host"`
		}
		_ = json.Unmarshal(got.Result, &res)
		if err != nil || got.State != store.JobSucceeded || got.Runs != 1 || res.Host != "lab" {
			t.Fatalf("job %s %q runs %d on %q (%v); want it moved to lab at once", got.State, got.Error, got.Runs, res.Host, err)
		}
		if s := eng.Statuses(); s[0].Name != "dead" || !s[0].Known || s[0].Up {
			t.Fatalf("dead was not tried first: %+v", s)
		}
	})
}

// A klbr-core killed after it claimed a remote job's attempt and before it
// recorded the host: nothing was sent anywhere, so the restart puts the job
// back to pending (sent again as its next attempt), never unknown.
func TestRemoteJobNeverPlacedIsPendingAgain(t *testing.T) {
	if _, err := exec.LookPath("ssh"); err != nil {
		citest.SkipOrFail(t, "ssh is missing (apt-get install -y openssh-client)")
	}
	ctx := t.Context()
	dir := t.TempDir()
	st, err := store.Open(ctx, dir, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var id int64
	if err := st.Write(ctx, func(tx *store.Tx) error {
		if _, err := tx.EnsureSession("default"); err != nil {
			return err
		}
		if id, err = tx.InsertJob(store.NewJob{Kind: KindCommand, Session: "default", Recovery: Manual,
			Spec: mustJSON(CommandSpec{Argv: []string{"true"}, Host: "gone", Timeout: 60})}); err != nil {
			return err
		}
		_, err = tx.StartJob(id) // claimed; the kill came before PlaceJob
		return err
	}); err != nil {
		t.Fatal(err)
	}
	// The host refuses connections at once: the next attempt is deferred.
	tg, err := config.ParseSSHTarget("klbr@127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	eng, err := hosts.New(hosts.Config{ConnectTimeout: time.Second, Hosts: map[string]hosts.Host{"gone": {Name: "gone", Target: tg,
		IdentityFile: "/nonexistent", KnownHostsFile: "/nonexistent", MaxJobs: 1, Wall: time.Hour}}})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	m := New(Config{Store: st, Workspace: dir, Hosts: eng})
	if err := m.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	poll(t, "the job tried again as its next attempt", time.Minute, func() bool {
		j, _ := st.Job(ctx, id)
		return j.State == store.JobPending && j.Runs == 2
	})
	j, _ := st.Job(ctx, id)
	if !strings.Contains(j.Error, "not started: host gone: host unreachable") {
		t.Fatalf("job %s %q runs %d; want pending, its next attempt not started for its host", j.State, j.Error, j.Runs)
	}
	page, err := st.Records(ctx, "default", 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range page {
		if r.Kind == "job.input" {
			t.Fatalf("the owner was told %s; nothing ran, nothing to tell", r.Content)
		}
	}
}
