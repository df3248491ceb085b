package placement

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/systemdlab"
)

// The systemd scope mode is tested against a real systemd: TestSystemdScope boots one as
// PID 1 of fresh PID, mount and network namespaces (package systemdlab) and runs this test
// binary inside it (scope PIDs are namespace PIDs), where TestSystemdScopeInLab does the
// work. The environment tells the inner run where it is.
const (
	labBusEnv    = "KLBR_PLACEMENT_LAB_BUS"    // the D-Bus address inside the lab
	labKernelEnv = "KLBR_PLACEMENT_LAB_KERNEL" // a klbr-kernel binary built outside
)

func TestSystemdScope(t *testing.T) {
	if os.Getenv(labBusEnv) != "" {
		t.Skip("inside the lab: TestSystemdScopeInLab runs here")
	}
	requireRoot(t)
	systemdlab.Require(t)
	kernel := klbrKernel(t)
	lab, err := systemdlab.Prepare(t, filepath.Join(t.TempDir(), "lab"), "klbr-placement-lab")
	if err != nil {
		t.Fatal(err)
	}
	pid1, halt, err := lab.Boot(t)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(halt)

	args := []string{"-t", pid1, "-m", "-p", os.Args[0], "-test.run", "^TestSystemdScopeInLab$", "-test.v", "-test.count=1"}
	cmd := exec.Command("nsenter", args...)
	cmd.Env = append(os.Environ(), labBusEnv+"=unix:path=/run/dbus/system_bus_socket", labKernelEnv+"="+kernel)
	var inner bytes.Buffer
	cmd.Stdout, cmd.Stderr = &inner, &inner
	err = cmd.Run()
	t.Logf("inside the lab:\n%s", inner.String())
	if err != nil {
		t.Fatalf("the test inside the lab failed: %v", err)
	}
	if !strings.Contains(inner.String(), "--- PASS: TestSystemdScopeInLab") {
		t.Fatal("the test inside the lab did not pass")
	}
}

// TestSystemdScopeInLab runs inside the namespace that TestSystemdScope booted.
func TestSystemdScopeInLab(t *testing.T) {
	bus := os.Getenv(labBusEnv)
	if bus == "" {
		t.Skip("runs inside the systemd lab that TestSystemdScope boots")
	}
	ctx := testCtx(t)
	p, err := Detect(ctx, Options{SystemdBus: bus})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if p.Mode() != ModeSystemdScope || len(p.Skipped()) != 0 {
		t.Fatalf("mode %s, skipped %v; want systemd-scope first", p.Mode(), p.Skipped())
	}
	sp := p.(*systemdPlacer)
	t.Log(sp.describe())

	t.Run("fork bomb bounded by TasksMax, Release removes the scope", func(t *testing.T) {
		const tasksMax = 20
		h := startHeld(t, python(t), "-c", `
import os, time
started = failed = 0
for i in range(200):
    try:
        pid = os.fork()
    except OSError:
        failed += 1
        continue
    if pid == 0:
        time.sleep(1000)
        os._exit(0)
    started += 1
print(started, failed, flush=True)
time.sleep(1000)
`)
		spec := Spec{Role: "test", Session: "forkbomb", Generation: 1,
			Limits: Limits{TasksMax: tasksMax, MemoryMaxBytes: 256 << 20, CPUQuotaPercent: 50}}
		start := time.Now()
		pl, err := p.Place(ctx, h.cmd.Process.Pid, spec)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("placed in %s: %s", time.Since(start), pl.Describe())
		t.Cleanup(func() { _ = pl.Release(ctx) })
		unit := "klbr-test-forkbomb-1.scope"
		props, err := sp.conn.GetUnitTypePropertiesContext(ctx, unit, "Scope")
		if err != nil {
			t.Fatal(err)
		}
		for name, want := range map[string]any{"TasksMax": uint64(tasksMax), "MemoryMax": uint64(256 << 20),
			"CPUQuotaPerSecUSec": uint64(500000), "Slice": "klbr.slice", "Delegate": false} {
			if props[name] != want {
				t.Errorf("%s = %v (%T), want %v", name, props[name], props[name], want)
			}
		}
		cg, _ := os.ReadFile("/proc/" + strconv.Itoa(h.cmd.Process.Pid) + "/cgroup")
		if !strings.Contains(string(cg), "/klbr.slice/"+unit+"\n") {
			t.Fatalf("process not in the scope:\n%s", cg)
		}
		h.goAhead(t)
		waitFor(t, 20*time.Second, "the fork loop", func() bool { out, _ := h.output(); return strings.Contains(out, "\n") })
		out, _ := h.output()
		f := strings.Fields(out)
		if started, _ := strconv.Atoi(f[0]); started != tasksMax-1 {
			t.Errorf("started %s processes, failed %s; want %d started", f[0], f[1], tasksMax-1)
		}
		start = time.Now()
		if err := pl.Release(ctx); err != nil {
			t.Fatal(err)
		}
		t.Logf("released in %s", time.Since(start))
		ws := h.waitStatus(t, 10*time.Second)
		if !ws.Signaled() {
			t.Errorf("placed process ended with %v, want killed", ws)
		}
		waitFor(t, 5*time.Second, "the unit to be unloaded", func() bool {
			v, err := sp.conn.GetUnitPropertyContext(ctx, unit, "LoadState")
			return err == nil && v.Value.Value() == "not-found"
		})
	})

	t.Run("memory hog OOM-killed under MemoryMax", func(t *testing.T) {
		// The hog runs under a sh that stays, so the scope (and its counters) outlive it.
		h := startHeld(t, "sh", "-c", `"$0" -c 'b = b"\x01" * (1 << 30)'; echo $?; exec sleep 1000`, python(t))
		pl, err := p.Place(ctx, h.cmd.Process.Pid, Spec{Role: "test", Session: "hog", Generation: 1,
			Limits: Limits{MemoryMaxBytes: 64 << 20}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = pl.Release(ctx) })
		if oom, err := pl.OOMKilled(); err != nil || oom {
			t.Fatalf("before: OOMKilled = %v, %v", oom, err)
		}
		h.goAhead(t)
		waitFor(t, 20*time.Second, "the hog to end", func() bool { out, _ := h.output(); return strings.Contains(out, "\n") })
		if out, errOut := h.output(); strings.TrimSpace(out) != "137" {
			t.Fatalf("hog exit %q, want 137 (SIGKILL by the OOM killer); stderr %q", out, errOut)
		}
		if oom, err := pl.OOMKilled(); err != nil || !oom {
			t.Fatalf("OOMKilled = %v, %v; want true", oom, err)
		}
		if err := pl.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if oom, err := pl.OOMKilled(); err != nil || !oom {
			t.Fatalf("after Release: OOMKilled = %v, %v", oom, err)
		}
	})

	t.Run("a worker that leaves its cgroup and kills its kernel is still contained (20 tries)", func(t *testing.T) {
		escapeTrials(t, p, os.Getenv(labKernelEnv), 20)
	})

	t.Run("klbr-kernel placed before the go-ahead; its tree dies with it", func(t *testing.T) {
		kernel := os.Getenv(labKernelEnv)
		goR, goW, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		pidFile := filepath.Join(t.TempDir(), "daemon.pid")
		cmd := exec.Command(kernel, "--go-ahead-fd", "3", "--", "sh", "-c",
			`(setsid sleep 1000 & echo $! > "$1"); sleep 0.2`, "sh", pidFile)
		cmd.ExtraFiles = []*os.File{goR}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		goR.Close()
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		pl, err := p.Place(ctx, cmd.Process.Pid, Spec{Role: "workbench", Session: "default", Generation: 2,
			Limits: Limits{TasksMax: 64, MemoryMaxBytes: 128 << 20}})
		if err != nil {
			goW.Close()
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = pl.Release(ctx) })
		goW.Write([]byte{1})
		goW.Close()
		if err := cmd.Wait(); err != nil {
			t.Fatalf("kernel: %v", err)
		}
		b, _ := os.ReadFile(pidFile)
		daemon, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		if daemon == 0 || alive(daemon) {
			t.Fatalf("daemon %d survived the kernel", daemon)
		}
		// The scope is empty now; systemd stops it on its own. Release must still succeed.
		if err := pl.Release(ctx); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("a stale scope of the same name is replaced", func(t *testing.T) {
		h1 := startHeld(t, "sleep", "1000")
		spec := Spec{Role: "test", Session: "stale", Generation: 1}
		if _, err := p.Place(ctx, h1.cmd.Process.Pid, spec); err != nil {
			t.Fatal(err)
		}
		h2 := startHeld(t, "sleep", "1000")
		pl, err := p.Place(ctx, h2.cmd.Process.Pid, spec)
		if err != nil {
			t.Fatal(err)
		}
		if ws := h1.waitStatus(t, 10*time.Second); !ws.Signaled() {
			t.Errorf("the stale scope's process ended with %v, want killed", ws)
		}
		if err := pl.Release(ctx); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("a dead bus is an error, not a hang", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err := NewSystemd(ctx, Options{SystemdBus: "unix:path=/run/no-such-bus"})
		if err == nil {
			t.Fatal("want an error")
		}
	})
}
