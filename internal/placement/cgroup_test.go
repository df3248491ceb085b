package placement

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/citest"
)

// cgroupPlacer returns the cgroup placer of this machine, or skips (fails under CI=true).
func newCgroupPlacer(t *testing.T) *cgroupPlacer {
	t.Helper()
	requireRoot(t)
	p, err := NewCgroup(Options{})
	if err != nil {
		citest.SkipOrFail(t, "no writable cgroup here: "+err.Error())
	}
	t.Logf("cgroup placer: %s", p.(*cgroupPlacer).describe())
	return p.(*cgroupPlacer)
}

func TestCgroupForkBombBoundedByTasksMax(t *testing.T) {
	p := newCgroupPlacer(t)
	ctx := testCtx(t)
	const tasksMax = 20
	// 200 fork attempts; every child sleeps. Only tasksMax-1 can exist next to the parent.
	h := startHeld(t, python(t), "-c", `
import os, sys, time
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
	pl, err := p.Place(ctx, h.cmd.Process.Pid, Spec{Role: "test", Session: "forkbomb", Generation: 1, Limits: Limits{TasksMax: tasksMax}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pl.Release(ctx) })
	cp := pl.(*cgroupPlacement)
	t.Log(pl.Describe())
	procs := filepath.Join(cp.dirs["pids"], "cgroup.procs")
	var pids []int
	t.Cleanup(func() { killAll(pids) })
	h.goAhead(t)
	waitFor(t, 20*time.Second, "the fork loop to finish", func() bool {
		out, _ := h.output()
		return strings.Contains(out, "\n")
	})
	out, _ := h.output()
	f := strings.Fields(out)
	started, _ := strconv.Atoi(f[0])
	failed, _ := strconv.Atoi(f[1])
	pids, _ = readPids(procs)
	if started != tasksMax-1 || failed != 200-started {
		t.Errorf("started %d, failed %d; want %d started", started, failed, tasksMax-1)
	}
	if len(pids) > tasksMax {
		t.Fatalf("%d processes in the cgroup, pids.max is %d", len(pids), tasksMax)
	}
	b, _ := os.ReadFile(filepath.Join(cp.dirs["pids"], "pids.max"))
	if strings.TrimSpace(string(b)) != strconv.Itoa(tasksMax) {
		t.Fatalf("pids.max = %q", b)
	}

	start := time.Now()
	if err := pl.Release(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("released %d processes in %s", len(pids), time.Since(start))
	for _, pid := range pids {
		if alive(pid) && pid != h.cmd.Process.Pid { // the placed process is our child: a zombie until waited
			t.Errorf("pid %d survived Release", pid)
		}
	}
	for _, dir := range cp.uniqueDirs() {
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("cgroup %s still exists after Release (%v)", dir, err)
		}
	}
	if err := pl.Release(ctx); err != nil {
		t.Fatalf("second Release: %v", err)
	}
}

func TestCgroupMemoryHogIsOOMKilled(t *testing.T) {
	p := newCgroupPlacer(t)
	ctx := testCtx(t)
	h := startHeld(t, python(t), "-c", `b = b"\x01" * (1 << 30); print("allocated", len(b))`)
	pl, err := p.Place(ctx, h.cmd.Process.Pid, Spec{Role: "test", Session: "hog", Generation: 1,
		Limits: Limits{MemoryMaxBytes: 64 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pl.Release(ctx) })
	if oom, err := pl.OOMKilled(); err != nil || oom {
		t.Fatalf("before: OOMKilled = %v, %v", oom, err)
	}
	start := time.Now()
	h.goAhead(t)
	ws := h.waitStatus(t, 30*time.Second)
	stdout, stderr := h.output()
	if !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("hog ended with %v (stdout %q, stderr %q), want SIGKILL by the OOM killer", ws, stdout, stderr)
	}
	t.Logf("hog OOM-killed %s after the go-ahead", time.Since(start))
	if oom, err := pl.OOMKilled(); err != nil || !oom {
		t.Fatalf("OOMKilled = %v, %v; want true", oom, err)
	}
	if err := pl.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if oom, err := pl.OOMKilled(); err != nil || !oom {
		t.Fatalf("after Release: OOMKilled = %v, %v; want the value seen before", oom, err)
	}
	// The test process (the "core") was not touched: it is running this line, and its own
	// memory cgroup, the parent, has no OOM kill on record from the hog.
}

// TestCgroupWithKernel is the core's flow: start klbr-kernel on hold, place it by pid,
// send the go-ahead; its tree (here a double-forked daemon and a memory hog) is inside.
func TestCgroupWithKernel(t *testing.T) {
	p := newCgroupPlacer(t)
	ctx := testCtx(t)
	kernel := klbrKernel(t)
	py := python(t)
	goR, goW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	daemonPidFile := filepath.Join(dir, "daemon.pid")
	script := `(setsid sleep 1000 & echo $! > "$1"); exec "$2" -c 'b = b"\x01" * (1 << 30)'`
	cmd := exec.Command(kernel, "--go-ahead-fd", "3", "--", "sh", "-c", script, "sh", daemonPidFile, py)
	cmd.ExtraFiles = []*os.File{goR}
	stderr, err := os.Create(filepath.Join(dir, "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	defer stderr.Close()
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	goR.Close()
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })

	pl, err := p.Place(ctx, cmd.Process.Pid, Spec{Role: "workbench", Session: "e2e", Generation: 7,
		Limits: Limits{MemoryMaxBytes: 64 << 20, TasksMax: 64, CPUQuotaPercent: 50}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pl.Release(ctx) })
	t.Log(pl.Describe())
	cg, _ := os.ReadFile("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/cgroup")
	if !strings.Contains(string(cg), "/klbr-workbench-e2e-7-p"+strconv.Itoa(os.Getpid())+"\n") {
		t.Fatalf("kernel not in its cgroup:\n%s", cg)
	}
	if _, err := goW.Write([]byte{1}); err != nil {
		t.Fatal(err)
	}
	goW.Close()
	err = cmd.Wait()
	ws := cmd.ProcessState.Sys().(syscall.WaitStatus)
	log, _ := os.ReadFile(stderr.Name())
	if ws.ExitStatus() != 128+9 {
		t.Fatalf("kernel exit %v (%v), want 137 (child OOM-killed); stderr: %s", ws.ExitStatus(), err, log)
	}
	if !strings.Contains(string(log), "klbr-kernel: child killed by SIGKILL; the memory cgroup has recorded 1 OOM kill(s)") {
		t.Errorf("the kernel did not report the OOM kill: %s", log)
	}
	// The kernel has exited; the cgroup stays until Release, so the core can still ask.
	if oom, err := pl.OOMKilled(); err != nil || !oom {
		t.Fatalf("OOMKilled = %v, %v after the kernel exited; want true", oom, err)
	}
	b, _ := os.ReadFile(daemonPidFile)
	daemon, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if daemon == 0 || alive(daemon) {
		t.Fatalf("daemon %d: the kernel should have killed it", daemon)
	}
	if err := pl.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestCgroupReleaseKillsEscapees: a process that double-forks a daemon into its own session
// and exits leaves the daemon in the cgroup; Release kills it.
func TestCgroupReleaseKillsEscapees(t *testing.T) {
	p := newCgroupPlacer(t)
	ctx := testCtx(t)
	pidFile := filepath.Join(t.TempDir(), "daemon.pid")
	h := startHeld(t, "sh", "-c", `(setsid sleep 1000 & echo $! > "$1")`, "sh", pidFile)
	pl, err := p.Place(ctx, h.cmd.Process.Pid, Spec{Role: "test", Session: "escape", Generation: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pl.Release(ctx) })
	h.goAhead(t)
	h.waitStatus(t, 10*time.Second)
	b, _ := os.ReadFile(pidFile)
	daemon, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if daemon == 0 || !alive(daemon) {
		t.Fatalf("daemon %d not running", daemon)
	}
	t.Cleanup(func() { killAll([]int{daemon}) })
	if err := pl.Release(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the daemon to die", func() bool { return !alive(daemon) })
}

func TestParseMountinfoAndLayout(t *testing.T) {
	mi := `31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 /outer /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
50 23 0:40 / /elsewhere/cgroup rw,relatime - cgroup cgroup rw,blkio
51 23 0:41 / /sys/fs/cgroup\040x rw - cgroup cgroup rw,freezer
`
	mounts := parseMountinfo([]byte(mi), "/sys/fs/cgroup")
	if len(mounts) != 5 {
		t.Fatalf("got %d mounts: %+v", len(mounts), mounts)
	}
	if m := mounts[0]; m.point != "/sys/fs/cgroup/cpu,cpuacct" || !contains(m.controllers, "cpu") || !contains(m.controllers, "cpuacct") {
		t.Errorf("cpu mount: %+v", m)
	}
	if m := mounts[4]; !m.v2 || m.point != "/sys/fs/cgroup/unified" {
		t.Errorf("v2 mount: %+v", m)
	}
	self := parseProcCgroup([]byte("8:pids:/outer/svc\n4:memory:/a/b\n1:cpu,cpuacct:/\n0::/unified/path\n"))
	if self["pids"] != "/outer/svc" || self["memory"] != "/a/b" || self["cpuacct"] != "/" || self[""] != "/unified/path" {
		t.Fatalf("proc cgroup: %v", self)
	}
	if dir, err := hierarchyDir(mounts[2], self["pids"]); err != nil || dir != "/sys/fs/cgroup/pids/svc" {
		t.Errorf("pids dir = %q, %v (mount root /outer)", dir, err)
	}
	if dir, err := hierarchyDir(mounts[1], self["memory"]); err != nil || dir != "/sys/fs/cgroup/memory/a/b" {
		t.Errorf("memory dir = %q, %v", dir, err)
	}
	if _, err := hierarchyDir(mounts[2], "/other"); err == nil {
		t.Errorf("a cgroup outside the mounted root must not map")
	}
}

// TestV2LayoutAndLimits runs the v2 code on a directory tree shaped like cgroupfs (this
// machine's cgroup v2 hierarchy has no memory or pids controller, so the real thing runs
// only where it has).
func TestV2LayoutAndLimits(t *testing.T) {
	root := t.TempDir()
	own := filepath.Join(root, "system.slice", "klbr-core.service")
	if err := os.MkdirAll(own, 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(path, s string) {
		if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(own, "cgroup.controllers"), "cpuset cpu io memory pids\n")
	write(filepath.Join(own, "cgroup.subtree_control"), "")
	l, err := v2Layout(cgroupMount{point: root, root: "/", v2: true}, "/system.slice/klbr-core.service")
	if err != nil {
		t.Fatal(err)
	}
	if l.version != 2 || l.parents["memory"] != own || l.parents["pids"] != own || l.parents["cpu"] != own {
		t.Fatalf("layout %+v", l)
	}
	if b, _ := os.ReadFile(filepath.Join(own, "cgroup.subtree_control")); string(b) != "+memory +pids +cpu" {
		t.Fatalf("subtree_control = %q", b)
	}

	write(filepath.Join(own, "cgroup.controllers"), "cpu io\n")
	if _, err := v2Layout(cgroupMount{point: root, root: "/", v2: true}, "/system.slice/klbr-core.service"); err == nil ||
		!strings.Contains(err.Error(), "controller memory is not available") {
		t.Fatalf("want a missing-controller error, got %v", err)
	}

	// The limit files as the kernel would have created them.
	dir := filepath.Join(own, "klbr-workbench-default-1")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"memory.max", "pids.max", "cpu.max"} {
		write(filepath.Join(dir, f), "")
	}
	pl := &cgroupPlacement{version: 2, limits: Limits{MemoryMaxBytes: 512 << 20, TasksMax: 128, CPUQuotaPercent: 150},
		dirs: map[string]string{"memory": dir, "pids": dir, "cpu": dir}}
	if err := pl.setLimits(); err != nil {
		t.Fatal(err)
	}
	for f, want := range map[string]string{"memory.max": "536870912", "pids.max": "128", "cpu.max": "150000 100000"} {
		if b, _ := os.ReadFile(filepath.Join(dir, f)); string(b) != want {
			t.Errorf("%s = %q, want %q", f, b, want)
		}
	}
	write(filepath.Join(dir, "memory.events"), "low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\noom_group_kill 0\n")
	if oom, err := pl.OOMKilled(); err != nil || !oom {
		t.Fatalf("OOMKilled = %v, %v", oom, err)
	}
}

func TestSpecName(t *testing.T) {
	tests := []struct {
		spec Spec
		want string
	}{
		{Spec{Role: "workbench", Session: "default", Generation: 3}, "klbr-workbench-default-3"},
		{Spec{Role: "hooks", Session: "my-session/x", Generation: 12}, `klbr-hooks-my\x2dsession\x2fx-12`},
		{Spec{Role: "command", Session: ".hidden", Generation: 1}, `klbr-command-\x2ehidden-1`},
	}
	for _, tc := range tests {
		if got := tc.spec.Name(); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.spec, got, tc.want)
		}
	}
}

// TestCgroupCPUQuota: a busy loop of one second of wall time gets about a fifth of a CPU
// under a 20 % quota.
func TestCgroupCPUQuota(t *testing.T) {
	p := newCgroupPlacer(t)
	if _, ok := p.layout.parents["cpu"]; !ok {
		citest.SkipOrFail(t, "no cpu controller in the cgroup layout")
	}
	ctx := testCtx(t)
	h := startHeld(t, python(t), "-c", `
import time
t = time.monotonic()
while time.monotonic() - t < 1.0:
    pass
print(time.process_time())
`)
	pl, err := p.Place(ctx, h.cmd.Process.Pid, Spec{Role: "test", Session: "cpu", Generation: 1,
		Limits: Limits{CPUQuotaPercent: 20}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pl.Release(ctx) })
	h.goAhead(t)
	if ws := h.waitStatus(t, 20*time.Second); ws.ExitStatus() != 0 {
		t.Fatalf("busy loop: %v", ws)
	}
	out, _ := h.output()
	used, err := strconv.ParseFloat(strings.TrimSpace(out), 64)
	if err != nil {
		t.Fatalf("output %q", out)
	}
	t.Logf("CPU time in one wall-clock second under a 20%% quota: %.3f s", used)
	if used > 0.4 {
		t.Fatalf("used %.3f s of CPU in 1 s under a 20%% quota", used)
	}
}

func TestDeadInstancesAreSwept(t *testing.T) {
	p := newCgroupPlacer(t)
	var parent string
	for _, dir := range p.layout.parents {
		parent = dir
		break
	}
	// A pid that cannot be alive: above the kernel's maximum.
	dead := filepath.Join(parent, "klbr-workbench-swept-1-p99999999")
	alive := filepath.Join(parent, "klbr-workbench-kept-1-p"+strconv.Itoa(os.Getpid()))
	for _, d := range []string{dead, alive} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { os.Remove(dead); os.Remove(alive) })
	sweepDeadInstances(p.layout)
	if _, err := os.Stat(dead); err == nil {
		t.Error("the cgroup of a dead klbr-core was not swept")
	}
	if _, err := os.Stat(alive); err != nil {
		t.Error("the cgroup of a live process was swept")
	}
}
