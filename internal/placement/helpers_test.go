package placement

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/klbr-dev/klbr/internal/citest"
)

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		citest.SkipOrFail(t, "the test needs root")
	}
}

// python returns a real python3 interpreter (not a version-manager shim, whose own
// processes would count against task limits).
func python(t *testing.T) string {
	t.Helper()
	if _, err := os.Stat("/usr/bin/python3"); err == nil {
		return "/usr/bin/python3"
	}
	p, err := exec.LookPath("python3")
	if err != nil {
		citest.SkipOrFail(t, "python3 is not installed")
	}
	return p
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// held is a process started on hold: a sh that waits for a line on stdin before it execs
// argv, so the test can place it before it runs anything (what the go-ahead does for
// klbr-kernel).
type held struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stdout *os.File
	stderr *os.File
	wait   func() error
}

func startHeld(t *testing.T, argv ...string) *held {
	t.Helper()
	cmd := exec.Command("sh", append([]string{"-c", `read _ && exec "$@"`, "sh"}, argv...)...)
	dir := t.TempDir()
	out, err := os.Create(filepath.Join(dir, "stdout"))
	if err != nil {
		t.Fatal(err)
	}
	errf, err := os.Create(filepath.Join(dir, "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = out, errf
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h := &held{cmd: cmd, stdin: stdin, stdout: out, stderr: errf, wait: sync.OnceValue(cmd.Wait)}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = h.wait()
		out.Close()
		errf.Close()
	})
	return h
}

func (h *held) goAhead(t *testing.T) {
	t.Helper()
	if _, err := io.WriteString(h.stdin, "go\n"); err != nil {
		t.Fatal(err)
	}
	h.stdin.Close()
}

func (h *held) output() (stdout, stderr string) {
	a, _ := os.ReadFile(h.stdout.Name())
	b, _ := os.ReadFile(h.stderr.Name())
	return string(a), string(b)
}

// waitStatus waits for the held process and returns its wait status.
func (h *held) waitStatus(t *testing.T, within time.Duration) syscall.WaitStatus {
	t.Helper()
	done := make(chan struct{})
	go func() { _ = h.wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(within):
		t.Fatalf("process %d did not exit within %s", h.cmd.Process.Pid, within)
	}
	return h.cmd.ProcessState.Sys().(syscall.WaitStatus)
}

// waitFor polls cond until it holds or within passes.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", within, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i > 0 && i+2 < len(s) && s[i+2] != 'Z' && s[i+2] != 'X'
}

var (
	kernelOnce sync.Once
	kernelPath string
	kernelErr  error
)

// klbrKernel builds cmd/klbr-kernel once per test binary.
func klbrKernel(t *testing.T) string {
	t.Helper()
	kernelOnce.Do(func() {
		dir, err := os.MkdirTemp("", "klbr-placement-test-")
		if err != nil {
			kernelErr = err
			return
		}
		kernelPath = filepath.Join(dir, "klbr-kernel")
		gobin, err := exec.LookPath("go")
		if err != nil {
			gobin = filepath.Join(runtime.GOROOT(), "bin", "go")
		}
		if out, err := exec.Command(gobin, "build", "-o", kernelPath, "github.com/klbr-dev/klbr/cmd/klbr-kernel").CombinedOutput(); err != nil {
			kernelErr = fmt.Errorf("build klbr-kernel: %v\n%s", err, out)
		}
	})
	if kernelErr != nil {
		t.Fatal(kernelErr)
	}
	return kernelPath
}

func TestMain(m *testing.M) {
	code := m.Run()
	if kernelPath != "" {
		os.RemoveAll(filepath.Dir(kernelPath))
	}
	os.Exit(code)
}

// killAll SIGKILLs the pids (a test's safety net).
func killAll(pids []int) {
	for _, pid := range pids {
		_ = unix.Kill(pid, unix.SIGKILL)
	}
}
