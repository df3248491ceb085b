package placement

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/citest"
	"github.com/klbr-dev/klbr/internal/kernel"
)

// escapeScript is the outside test's escape: a double-forked sleeper in a new session
// writes itself into every root cgroup.procs it finds, then the worker SIGKILLs its own
// klbr-kernel. It writes "<sleeper pid> <moved|refused> <killed|refused>" to argv[1].
const escapeScript = `
import glob, os, signal, sys, time
out = sys.argv[1]
r, w = os.pipe()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        moved = "refused"
        for p in ["/sys/fs/cgroup/cgroup.procs"] + glob.glob("/sys/fs/cgroup/*/cgroup.procs"):
            try:
                with open(p, "w") as f:
                    f.write(str(os.getpid()))
                moved = "moved"
            except OSError:
                pass
        os.write(w, (str(os.getpid()) + " " + moved).encode())
        os.close(w)
        while True:
            time.sleep(1)
    os._exit(0)
os.close(w)
line = os.read(r, 100).decode()
try:
    os.kill(os.getppid(), signal.SIGKILL)
    killed = "killed"
except OSError:
    killed = "refused"
with open(out + ".tmp", "w") as f:
    f.write(line + " " + killed)
os.rename(out + ".tmp", out)
time.sleep(1000)
`

// escapeTrials runs the escape tries times under p, with the sandbox the daemon gives
// workers when it runs as root and no other uid can run them (uid 0, no capabilities,
// Landlock: the weakest it ever uses), and requires every sleeper gone after the worker is
// killed the way the core kills it (SIGUSR1 to the kernel, then SIGKILL, then Release).
func escapeTrials(t *testing.T, p Placer, kernelBin string, tries int) {
	t.Helper()
	if _, err := kernel.LandlockABI(); err != nil {
		citest.SkipOrFail(t, "landlock unavailable: "+err.Error())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	py := python(t)
	data, ws := filepath.Join(t.TempDir(), "data"), t.TempDir()
	os.MkdirAll(data, 0o700)
	sb := kernel.Sandbox{Deny: []string{data}, ReadWrite: []string{ws}, DropCaps: os.Geteuid() == 0}
	var sleepers []int
	defer func() { killAll(sleepers) }()
	for i := range tries {
		spec := Spec{Role: "workbench", Session: "escape", Generation: int64(i + 1), Limits: Limits{TasksMax: 64, MemoryMaxBytes: 256 << 20}}
		out := filepath.Join(ws, "escape-"+strconv.Itoa(i))
		args := append(append(p.KernelArgs(spec), sb.Args()...), "--go-ahead-fd", "3", "--", py, "-S", "-c", escapeScript, out)
		goR, goW, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(kernelBin, args...)
		cmd.ExtraFiles = []*os.File{goR}
		var stderr strings.Builder
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		goR.Close()
		waited := make(chan struct{})
		go func() { cmd.Wait(); close(waited) }()
		pl, err := p.Place(ctx, cmd.Process.Pid, spec)
		if err != nil {
			goW.Close()
			t.Fatal(err)
		}
		goW.Write([]byte{1})
		goW.Close()
		var line string
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			b, err := os.ReadFile(out)
			if err == nil {
				line = string(b)
				break
			}
			if time.Now().After(deadline) {
				cmd.Process.Kill()
				<-waited
				t.Fatalf("try %d: no report from the escape within 10 s; kernel stderr: %s", i, stderr.String())
			}
		}
		f := strings.Fields(line)
		if len(f) != 3 {
			t.Fatalf("try %d: report %q", i, line)
		}
		pid, _ := strconv.Atoi(f[0])
		sleepers = append(sleepers, pid)
		if f[1] != "refused" || f[2] != "refused" {
			t.Errorf("try %d: cgroup move %s, kernel kill %s; want both refused", i, f[1], f[2])
		}
		// The core's kill: SIGUSR1 (the kernel kills its tree), SIGKILL after a grace, then
		// the placement's release.
		cmd.Process.Signal(syscall.SIGUSR1)
		select {
		case <-waited:
		case <-time.After(3 * time.Second):
			cmd.Process.Kill()
			<-waited
		}
		if err := pl.Release(ctx); err != nil {
			t.Fatalf("try %d: release: %v", i, err)
		}
		waitFor(t, 5*time.Second, "the sleeper of try "+strconv.Itoa(i)+" to die", func() bool { return !alive(pid) })
	}
}

func TestEscapeRlimit(t *testing.T) {
	escapeTrials(t, NewRlimit(), klbrKernel(t), 20)
}

func TestEscapeCgroup(t *testing.T) {
	requireRoot(t)
	p, err := NewCgroup(Options{})
	if err != nil {
		t.Skipf("cgroup mode unavailable here: %v", err)
	}
	escapeTrials(t, p, klbrKernel(t), 20)
}
