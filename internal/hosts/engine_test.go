package hosts

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/config"
	"github.com/klbr-dev/klbr/internal/hosttest"
	"github.com/klbr-dev/klbr/internal/kernel"
)

// labEngine returns an engine that knows the booted host h as "lab".
func labEngine(t *testing.T, h *hosttest.Host, mod func(*Host)) *Engine {
	t.Helper()
	tg, err := config.ParseSSHTarget(h.SSH())
	if err != nil {
		t.Fatal(err)
	}
	hh := Host{Name: "lab", Target: tg, IdentityFile: h.IdentityFile, KnownHostsFile: h.KnownHostsFile,
		Labels: []string{"big"}, MaxJobs: 2, MemoryMaxBytes: 256 << 20, TasksMax: 64, CPUQuotaPct: 100,
		Wall: time.Hour, WorkDir: h.WorkDir}
	if mod != nil {
		mod(&hh)
	}
	e, err := New(Config{Hosts: map[string]Host{"lab": hh}, ConnectTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return e
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// waitEnded polls the unit until its main process ended.
func waitEnded(t *testing.T, e *Engine, unit string) UnitState {
	t.Helper()
	ctx := ctxT(t)
	for {
		st, err := e.State(ctx, "lab", unit)
		if err != nil {
			t.Fatal(err)
		}
		if st[0].Ended() || !st[0].Exists() {
			return st[0]
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s did not end: %+v", unit, st[0])
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func TestEngine(t *testing.T) {
	h := hosttest.Start(t)
	e := labEngine(t, h, nil)
	ctx := ctxT(t)
	netns, err := h.NetNS()
	if err != nil {
		t.Fatal(err)
	}

	t.Run("a unit runs on the host, once, with its limits, and is collected", func(t *testing.T) {
		const unit = "klbr-job-1-1.service"
		u := Unit{Name: unit, Description: "test", Env: map[string]string{"GREETING": "it's here"}, Argv: []string{"sh", "-c",
			`readlink /proc/self/ns/net; echo "$GREETING"; cat /proc/self/cgroup | grep -m1 klbr.slice`}}
		existed, err := e.Start(ctx, "lab", u)
		if err != nil || existed {
			t.Fatalf("start: existed %v, %v", existed, err)
		}
		st := waitEnded(t, e, unit)
		if code, why := st.Outcome(); code != 0 {
			t.Fatalf("outcome %d %s (%+v)", code, why, st)
		}
		if existed, err := e.Start(ctx, "lab", u); err != nil || !existed {
			t.Fatalf("a second start of %s: existed %v, %v; want the unit found, not started again", unit, existed, err)
		}
		var out bytes.Buffer
		n, err := e.Output(ctx, "lab", unit, 1<<20, &out)
		if err != nil || n != int64(out.Len()) {
			t.Fatalf("output %d bytes (%v), got %d", n, err, out.Len())
		}
		for _, want := range []string{netns + "\n", "it's here\n", "/klbr.slice/" + unit} {
			if !strings.Contains(out.String(), want) {
				t.Fatalf("the unit printed\n%s\nwant %q", out.String(), want)
			}
		}
		// The job cannot ask systemd (see TestJobSeesOnlyItsOwnDirectory): the host is asked.
		limits, err := h.Enter("systemctl", "show", "-p", "MemoryMax", "-p", "TasksMax", unit).Output()
		if err != nil || !strings.Contains(string(limits), "MemoryMax=268435456") || !strings.Contains(string(limits), "TasksMax=64") {
			t.Fatalf("the unit's limits: %s (%v)", limits, err)
		}
		if err := e.Collect(ctx, "lab", unit); err != nil {
			t.Fatal(err)
		}
		if st, err := e.State(ctx, "lab", unit); err != nil || st[0].Exists() {
			t.Fatalf("after collect: %+v %v", st, err)
		}
		if _, err := os.Stat(filepath.Join(h.WorkDir, unit)); !os.IsNotExist(err) {
			t.Fatalf("the unit's directory stayed: %v", err)
		}
	})

	t.Run("a unit started once and gone since is never started again", func(t *testing.T) {
		const unit = "klbr-job-8-1.service"
		u := Unit{Name: unit, Argv: []string{"true"}}
		if _, err := e.Start(ctx, "lab", u); err != nil {
			t.Fatal(err)
		}
		waitEnded(t, e, unit)
		// The host rebooted: the unit is gone, its directory is not.
		h.Enter("systemctl", "stop", unit).Run()
		h.Enter("systemctl", "reset-failed", unit).Run()
		if st, err := e.State(ctx, "lab", unit); err != nil || st[0].Exists() {
			t.Fatalf("the unit is still there: %+v %v", st, err)
		}
		if existed, err := e.Start(ctx, "lab", u); !errors.Is(err, ErrGone) || existed {
			t.Fatalf("a start of the gone unit: existed %v, %v; want ErrGone", existed, err)
		}
		if st, err := e.State(ctx, "lab", unit); err != nil || st[0].Exists() {
			t.Fatalf("the gone unit was started again: %+v %v", st, err)
		}
		if err := e.Collect(ctx, "lab", unit); err != nil {
			t.Fatal(err)
		}
		if ents, _ := os.ReadDir(h.WorkDir); len(ents) != 0 {
			var names []string
			for _, e := range ents {
				names = append(names, e.Name())
			}
			t.Fatalf("collect left %v in the work directory", names)
		}
	})

	t.Run("a memory hog is killed by the host's systemd", func(t *testing.T) {
		const unit = "klbr-job-2-1.service"
		if _, err := e.Start(ctx, "lab", Unit{Name: unit, MemoryMaxBytes: 64 << 20, Argv: []string{"python3", "-c",
			"b = []\nwhile True: b.append(bytearray(16 << 20))"}}); err != nil {
			t.Fatal(err)
		}
		st := waitEnded(t, e, unit)
		code, why := st.Outcome()
		t.Logf("hog: %+v: %s", st, why)
		if code == 0 || !strings.Contains(why, "killed") {
			t.Fatalf("the hog was not killed: %d %s (%+v)", code, why, st)
		}
		_ = e.Collect(ctx, "lab", unit)
	})

	t.Run("stop leaves no process of the unit", func(t *testing.T) {
		const unit = "klbr-job-3-1.service"
		if _, err := e.Start(ctx, "lab", Unit{Name: unit, Argv: []string{"sh", "-c", "sleep 1001 & sleep 1002; wait"}}); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(30 * time.Second); ; {
			out, _ := h.Enter("pgrep", "-f", "sleep 100[12]").Output()
			if len(strings.Fields(string(out))) >= 3 { // sh and its two sleeps
				break
			}
			if time.Now().After(deadline) {
				st, err := e.State(ctx, "lab", unit)
				t.Fatalf("the unit's processes did not show: %q; %+v %v", out, st, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err := e.Stop(ctx, "lab", unit); err != nil {
			t.Fatal(err)
		}
		if out, err := h.Enter("pgrep", "-f", "sleep 100[12]").Output(); err == nil {
			t.Fatalf("processes of the stopped unit remain: %s", out)
		}
		_ = e.Collect(ctx, "lab", unit)
	})

	t.Run("one connection carries every command", func(t *testing.T) {
		if n, err := h.Accepted(); err != nil || n != 1 || e.Dials() != 1 {
			t.Fatalf("sshd accepted %d connections (%v), the engine dialed %d; want 1", n, err, e.Dials())
		}
	})

	t.Run("inspect reads systemd, klbr-kernel and its protocol, capacity and the klbr units", func(t *testing.T) {
		kern := filepath.Join(h.BinDir, "klbr-kernel")
		info := e.Inspect(ctx, "lab")
		if !info.Reachable || info.SystemdVersion < MinSystemd || info.CPUs < 1 || info.MemoryBytes <= 0 || info.Kernel != "" {
			t.Fatalf("inspect: %+v", info)
		}
		if p := info.Problems(); len(p) != 1 || p[0].Warn || !strings.Contains(p[0].What, "no klbr-kernel") {
			t.Fatalf("without klbr-kernel on the host: %+v", p)
		}
		// Something of that name that does not say its protocol.
		if err := os.WriteFile(kern, []byte("#!/bin/sh\necho 'usage: klbr-kernel -- ARGV' >&2; exit 2\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		info = e.Inspect(ctx, "lab")
		if p := info.Problems(); info.Kernel != kern || len(p) != 1 || p[0].Warn || !strings.Contains(p[0].What, "does not say its protocol") {
			t.Fatalf("an old klbr-kernel: %+v, %+v", info, p)
		}
		os.Remove(kern)
		if out, err := exec.Command("go", "build", "-o", kern, "github.com/klbr-dev/klbr/cmd/klbr-kernel").CombinedOutput(); err != nil {
			t.Fatalf("build klbr-kernel: %v\n%s", err, out)
		}
		const unit = "klbr-job-7-1.service"
		if _, err := e.Start(ctx, "lab", Unit{Name: unit, Argv: []string{"sleep", "1005"}}); err != nil {
			t.Fatal(err)
		}
		defer e.Collect(ctx, "lab", unit)
		info = e.Inspect(ctx, "lab")
		if p := info.Problems(); info.Kernel != kern || info.KernelProtocol != kernel.Protocol || info.KernelVersion == "" || len(p) != 0 {
			t.Fatalf("the real klbr-kernel: %+v, %+v", info, p)
		}
		if len(info.Units) != 1 || info.Units[0] != (UnitLine{Unit: unit, Active: "active", Sub: "running"}) {
			t.Fatalf("units %+v, want %s running", info.Units, unit)
		}
		if n, err := h.Accepted(); err != nil || n != 1 {
			t.Fatalf("inspect opened connections: sshd accepted %d (%v)", n, err)
		}
	})

	t.Run("an unknown host key is refused with the fix", func(t *testing.T) {
		empty := filepath.Join(t.TempDir(), "known_hosts")
		if err := os.WriteFile(empty, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		e2 := labEngine(t, h, func(x *Host) { x.KnownHostsFile = empty })
		_, err := e2.Start(ctx, "lab", Unit{Name: "klbr-job-4-1.service", Argv: []string{"true"}})
		var he *HostError
		if !errors.As(err, &he) || !errors.Is(err, ErrHostKey) || !strings.Contains(he.Fix, "ssh-keyscan -p 2222 "+h.Addr+" >> "+empty) {
			t.Fatalf("got %v, want a host key refusal with the ssh-keyscan fix", err)
		}
		if st, _ := e.State(ctx, "lab", "klbr-job-4-1.service"); st[0].Exists() {
			t.Fatal("the unit was started through a refused connection")
		}
	})

	t.Run("an unreachable host is reported, and nothing runs", func(t *testing.T) {
		e2 := labEngine(t, h, nil)
		h.SetLink(t, false)
		_, err := e2.Start(ctx, "lab", Unit{Name: "klbr-job-5-1.service", Argv: []string{"true"}})
		h.SetLink(t, true)
		if !errors.Is(err, ErrUnreachable) {
			t.Fatalf("got %v, want ErrUnreachable", err)
		}
		if s := e2.Statuses()[0]; s.Up || s.LastErr == "" {
			t.Fatalf("status %+v, want down with the reason", s)
		}
	})

	t.Run("a changed host key is refused with the fix", func(t *testing.T) {
		h.RotateHostKey(t)
		e2 := labEngine(t, h, nil)
		_, err := e2.Start(ctx, "lab", Unit{Name: "klbr-job-6-1.service", Argv: []string{"true"}})
		var he *HostError
		if !errors.As(err, &he) || !errors.Is(err, ErrHostKey) || !strings.Contains(he.Msg, "changed") ||
			!strings.Contains(he.Fix, "ssh-keygen -R '["+h.Addr+"]:2222' -f "+h.KnownHostsFile) {
			t.Fatalf("got %v, want a changed-key refusal with the fix", err)
		}
	})
}
