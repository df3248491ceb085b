package kernel

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/klbr-dev/klbr/internal/citest"
)

// kernelBin is the klbr-kernel binary built once for the tests.
var kernelBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "klbr-kernel-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	kernelBin = filepath.Join(dir, "klbr-kernel")
	if out, err := exec.Command(goTool(), "build", "-o", kernelBin, "github.com/klbr-dev/klbr/cmd/klbr-kernel").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build klbr-kernel: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(2)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return filepath.Join(runtime.GOROOT(), "bin", "go")
}

// python returns a real python3 interpreter (not a version-manager shim).
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

// procState returns the state letter and command name of pid, or ok=false if it is gone.
func procState(pid int) (state byte, comm string, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, "", false
	}
	e, ok := parseStat(b)
	if !ok {
		return 0, "", false
	}
	open, end := strings.IndexByte(string(b), '('), strings.LastIndexByte(string(b), ')')
	return e.state, string(b[open+1 : end]), true
}

// alive reports whether pid still runs the command comm (a zombie, a vanished pid or a
// reused one do not count).
func alive(pid int, comm string) bool {
	state, c, ok := procState(pid)
	return ok && state != 'Z' && state != 'X' && c == comm
}

// tracked is a process a test expects to be killed.
type tracked struct {
	name string // the label the test script printed
	pid  int
	comm string
}

// requireGone waits up to within for every tracked process to be gone, fails the test
// naming the survivors, and kills them so nothing outlives the test.
func requireGone(t *testing.T, procs []tracked, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		var left []tracked
		for _, p := range procs {
			if alive(p.pid, p.comm) {
				left = append(left, p)
			}
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			for _, p := range left {
				_ = unix.Kill(p.pid, unix.SIGKILL)
			}
			t.Fatalf("processes of the tree survived: %+v", left)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// killOnCleanup makes sure tracked processes die with the test whatever happens.
func killOnCleanup(t *testing.T, procs *[]tracked) {
	t.Cleanup(func() {
		for _, p := range *procs {
			if alive(p.pid, p.comm) {
				_ = unix.Kill(p.pid, unix.SIGKILL)
			}
		}
	})
}

// readTracked reads "label pid comm" lines from r until a line "ready", with a timeout.
func readTracked(t *testing.T, r io.Reader, procs *[]tracked) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) == 1 && f[0] == "ready" {
				done <- nil
				return
			}
			if len(f) != 3 {
				continue
			}
			pid, err := strconv.Atoi(f[1])
			if err != nil {
				continue
			}
			*procs = append(*procs, tracked{name: f[0], pid: pid, comm: f[2]})
		}
		done <- fmt.Errorf("output ended before ready: %v", sc.Err())
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no ready line within 10 s")
	}
}

// kernelChildren returns the live children of pid.
func kernelChildren(t *testing.T, pid int) []procEntry {
	t.Helper()
	procs, err := readProcs("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []procEntry
	for _, p := range procs {
		if p.ppid == pid {
			out = append(out, p)
		}
	}
	return out
}

// exitCode returns the exit status of a finished command as a shell would show it.
func exitCode(t *testing.T, err error) int {
	t.Helper()
	if err == nil {
		return 0
	}
	ee, ok := err.(*exec.ExitError)
	if !ok {
		t.Fatalf("wait: %v", err)
	}
	ws := ee.Sys().(syscall.WaitStatus)
	if ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ws.ExitStatus()
}

// logFile is a file that collects a process's stderr. Unlike a bytes.Buffer it needs no
// copying goroutine, so exec.Cmd.Wait cannot hang on a survivor that holds the pipe.
type logFile struct{ f *os.File }

func newLogFile(t *testing.T) *logFile {
	t.Helper()
	f, err := os.CreateTemp(t.TempDir(), "stderr-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return &logFile{f: f}
}

func (l *logFile) String() string {
	b, _ := os.ReadFile(l.f.Name())
	return string(b)
}
