package kernel

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// treeScript starts, besides the child itself (a sh), a background grandchild in the
// child's group, an orphan whose parent exits at once (reparented to the kernel), a sleep
// in its own session, and a Python double-forked daemon (setsid + fork, intermediate gone).
// It prints "label pid comm" for each, then "ready". $1 is the python interpreter.
const treeScript = `
echo child $$ sh
sleep 1000 & echo grandchild $! sleep
sh -c 'sleep 1000 & echo orphan $! sleep'
(setsid sleep 1000 & echo session $! sleep)
"$1" -c '
import os, time
r, w = os.pipe()
if os.fork() == 0:
    os.setsid()
    pid = os.fork()
    if pid == 0:
        os.close(r); os.close(w)
        time.sleep(1000)
        os._exit(0)
    os.write(w, str(pid).encode())
    os._exit(0)
os.close(w)
pid = os.read(r, 32).decode()
os.wait()
print("daemon", pid, "python3", flush=True)
'
echo ready
`

// startTree starts klbr-kernel with flags and the tree script followed by tail (what the
// child does once the tree is up), waits until the tree is up and returns the command and
// the tracked processes.
func startTree(t *testing.T, flags []string, tail string) (*exec.Cmd, *logFile, []tracked) {
	t.Helper()
	args := append(append([]string{}, flags...), "--", "sh", "-c", treeScript+tail, "sh", python(t))
	cmd := exec.Command(kernelBin, args...)
	stderr := newLogFile(t)
	cmd.Stderr = stderr.f
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	var procs []tracked
	killOnCleanup(t, &procs) // runs before the Wait above
	readTracked(t, out, &procs)
	if len(procs) != 5 {
		t.Fatalf("tree script reported %d processes, want 5: %+v", len(procs), procs)
	}
	for _, p := range procs {
		if p.name == "child" { // the child may be past its tail already
			continue
		}
		// A loaded machine may not have run setsid's exec of sleep yet.
		for deadline := time.Now().Add(5 * time.Second); !alive(p.pid, p.comm); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s (pid %d) is not running before the test", p.name, p.pid)
			}
		}
	}
	go func() { _, _ = io.Copy(io.Discard, out) }()
	return cmd, stderr, procs
}

func TestTreeKilledWhenChildExits(t *testing.T) {
	cmd, stderr, procs := startTree(t, nil, "sleep 0.5; exit 0") // long enough to see the tree alive first
	start := time.Now()
	if code := exitCode(t, cmd.Wait()); code != 0 {
		t.Fatalf("exit %d, want 0; stderr: %s", code, stderr)
	}
	t.Logf("kernel exited %s after ready; stderr: %s", time.Since(start), stderr)
	// The kernel has reaped everything before exiting: nothing may be left even briefly.
	requireGone(t, procs, 0)
}

func TestTreeKilledAtDeadline(t *testing.T) {
	cmd, stderr, procs := startTree(t, []string{"--deadline", "500ms"}, "exec sleep 1000")
	start := time.Now()
	if code := exitCode(t, cmd.Wait()); code != ExitDeadline {
		t.Fatalf("exit %d, want %d; stderr: %s", code, ExitDeadline, stderr)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("deadline kill took %s: the child dies of SIGTERM, no grace needed", took)
	}
	if !strings.Contains(stderr.String(), "klbr-kernel: deadline 500ms reached") {
		t.Errorf("stderr does not report the deadline: %s", stderr)
	}
	requireGone(t, procs, 0)
}

func TestTreeKilledWhenKernelsParentDies(t *testing.T) {
	py := python(t)
	// A tiny intermediate: a sh that starts the kernel in the background, prints its pid
	// and waits. SIGKILL of that sh must take the kernel and all of its tree along.
	inter := exec.Command("sh", "-c", `"$@" & echo kernel $! klbr-kernel; wait`, "sh",
		kernelBin, "--", "sh", "-c", treeScript+"exec sleep 1000", "sh", py)
	stderr := newLogFile(t)
	inter.Stderr = stderr.f
	out, err := inter.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := inter.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = inter.Process.Kill(); _ = inter.Wait() })
	var procs []tracked
	killOnCleanup(t, &procs)
	readTracked(t, out, &procs)
	if len(procs) != 6 {
		t.Fatalf("got %d processes, want the kernel and 5: %+v", len(procs), procs)
	}
	start := time.Now()
	if err := inter.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = inter.Wait()
	requireGone(t, procs, 5*time.Second)
	t.Logf("kernel and tree gone %s after the parent's SIGKILL; stderr: %s", time.Since(start), stderr.String())
	if !strings.Contains(stderr.String(), "klbr-kernel: parent died: killing the tree") {
		t.Errorf("stderr does not report the parent's death: %s", stderr.String())
	}
}

func TestExitCodes(t *testing.T) {
	dir := t.TempDir()
	notExec := filepath.Join(dir, "not-executable")
	if err := os.WriteFile(notExec, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
		want int
		max  time.Duration
	}{
		{"exit code", []string{"--", "sh", "-c", "exit 7"}, 7, time.Second},
		{"success", []string{"--", "true"}, 0, time.Second},
		{"killed by TERM", []string{"--", "sh", "-c", "kill -TERM $$"}, 128 + 15, time.Second},
		{"killed by KILL", []string{"--", "sh", "-c", "kill -KILL $$"}, 128 + 9, time.Second},
		{"deadline", []string{"--deadline", "200ms", "--", "sleep", "1000"}, ExitDeadline, time.Second},
		{"deadline ignoring TERM: grace then KILL", []string{"--deadline", "100ms", "--", "sh", "-c", "trap '' TERM; sleep 1000"},
			ExitDeadline, 100*time.Millisecond + termGrace + time.Second},
		{"exit before deadline", []string{"--deadline", "10s", "--", "sh", "-c", "exit 3"}, 3, time.Second},
		{"not found", []string{"--", "klbr-no-such-command"}, ExitNotFound, time.Second},
		{"not executable", []string{"--", notExec}, ExitCannotRun, time.Second},
		{"no --", []string{"sh", "-c", "exit 0"}, ExitKernel, time.Second},
		{"no command", []string{"--deadline", "1s", "--"}, ExitKernel, time.Second},
		{"bad flag", []string{"--bogus", "--", "true"}, ExitKernel, time.Second},
		{"fd not open", []string{"--protocol-fd", "9", "--", "true"}, ExitKernel, time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(kernelBin, tc.args...)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			start := time.Now()
			code := exitCode(t, cmd.Run())
			took := time.Since(start)
			if code != tc.want {
				t.Fatalf("exit %d, want %d; stderr: %s", code, tc.want, stderr.String())
			}
			if took > tc.max {
				t.Errorf("took %s, want at most %s", took, tc.max)
			}
			for _, line := range strings.Split(strings.TrimSpace(stderr.String()), "\n") {
				if line != "" && !strings.HasPrefix(line, "klbr-kernel: ") {
					t.Errorf("stderr line without the prefix: %q", line)
				}
			}
		})
	}
}

func TestEnvironmentAllowlist(t *testing.T) {
	cmd := exec.Command(kernelBin, "--keep-env", "KEEP_ME", "--", "/usr/bin/env")
	cmd.Env = []string{
		"PATH=/usr/bin:/bin", "HOME=/home/x", "LANG=C.UTF-8", "TZ=UTC", "USER=x", "LOGNAME=x",
		"TMPDIR=/tmp", "KLBR_SESSION=default", "KLBR_GENERATION=3", "PYTHONPATH=/rt/src",
		"PYTHONUNBUFFERED=1", "PYTHONSAFEPATH=1", "PYTHONIOENCODING=utf-8", "PYTHONDONTWRITEBYTECODE=1",
		"LC_ALL=C", "LC_CTYPE=C",
		"KEEP_ME=yes",
		"OPENAI_API_KEY=secret", "DISCORD_TOKEN=secret", "LD_PRELOAD=/evil.so", "PYTHONSTARTUP=/evil.py",
		"CREDENTIALS_DIRECTORY=/run/credentials/x", "NOTIFY_SOCKET=/run/systemd/notify", "KLBRX=no",
	}
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	got := strings.Split(strings.TrimSpace(string(out)), "\n")
	want := []string{
		"PATH=/usr/bin:/bin", "HOME=/home/x", "LANG=C.UTF-8", "TZ=UTC", "USER=x", "LOGNAME=x",
		"TMPDIR=/tmp", "KLBR_SESSION=default", "KLBR_GENERATION=3", "PYTHONPATH=/rt/src",
		"PYTHONUNBUFFERED=1", "PYTHONSAFEPATH=1", "PYTHONIOENCODING=utf-8", "PYTHONDONTWRITEBYTECODE=1",
		"LC_ALL=C", "LC_CTYPE=C", "KEEP_ME=yes",
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("child environment:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestFileDescriptors checks that the child gets exactly stdin (/dev/null), stdout, stderr
// and the protocol socket as fd 3, although the kernel inherited more; that the socket
// works; and that the core sees EOF on it once the child is gone.
func TestFileDescriptors(t *testing.T) {
	py := python(t)
	// An fd without close-on-exec in the test process leaks into every child it starts
	// from now on, the kernel included. That is the point; close it at the end.
	leak, err := unix.Open("/etc/hostname", unix.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(leak)

	core, worker := socketPair(t)
	goR, goW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	script := `
import os, socket
fds = {}
for name in os.listdir("/proc/self/fd"):
    try:
        fds[int(name)] = os.readlink("/proc/self/fd/" + name)
    except FileNotFoundError:
        pass  # the directory listing's own fd, closed by now
for fd in sorted(fds):
    print(fd, fds[fd])
s = socket.socket(fileno=3)
s.sendall(b"hello from fd 3")
`
	cmd := exec.Command(kernelBin, "--protocol-fd", "3", "--go-ahead-fd", "4", "--", py, "-c", script)
	cmd.ExtraFiles = []*os.File{worker, goR} // fds 3 and 4 in the kernel; the leak is above
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	worker.Close()
	goR.Close()
	// While it waits for the go-ahead the kernel itself must not hold the leaked fd either.
	leakPath := "/proc/" + strconv.Itoa(cmd.Process.Pid) + "/fd/" + strconv.Itoa(leak)
	for start := time.Now(); ; time.Sleep(5 * time.Millisecond) {
		if _, err := os.Readlink(leakPath); err != nil {
			break
		}
		if time.Since(start) > 5*time.Second {
			t.Fatalf("the kernel still holds inherited fd %d", leak)
		}
	}
	if _, err := goW.Write([]byte{1}); err != nil {
		t.Fatal(err)
	}
	goW.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("%v; stderr: %s", err, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	if len(lines) != 4 {
		t.Fatalf("child fds:\n%s\nwant exactly 0, 1, 2, 3", stdout.String())
	}
	for i, line := range lines {
		fd, target, _ := strings.Cut(line, " ")
		if fd != strconv.Itoa(i) {
			t.Fatalf("child fds:\n%s\nwant exactly 0, 1, 2, 3", stdout.String())
		}
		switch i {
		case 0:
			if target != "/dev/null" {
				t.Errorf("stdin is %s, want /dev/null", target)
			}
		case 3:
			if !strings.HasPrefix(target, "socket:") {
				t.Errorf("fd 3 is %s, want the protocol socket", target)
			}
		}
	}
	core.SetReadDeadline(time.Now().Add(5 * time.Second))
	got, err := io.ReadAll(core) // EOF: neither the child nor the kernel holds the socket
	if err != nil {
		t.Fatalf("read protocol socket: %v (got %q)", err, got)
	}
	if string(got) != "hello from fd 3" {
		t.Fatalf("protocol socket carried %q", got)
	}
}

func socketPair(t *testing.T) (*net.UnixConn, *os.File) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	coreFile := os.NewFile(uintptr(fds[0]), "core")
	c, err := net.FileConn(coreFile)
	coreFile.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c.(*net.UnixConn), os.NewFile(uintptr(fds[1]), "worker")
}

func TestGoAhead(t *testing.T) {
	for _, placed := range []bool{true, false} {
		name := map[bool]string{true: "byte starts the child", false: "EOF starts nothing"}[placed]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			marker := filepath.Join(t.TempDir(), "started")
			goR, goW, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(kernelBin, "--go-ahead-fd", "3", "--", "sh", "-c", `echo > "$1"; exit 5`, "sh", marker)
			cmd.ExtraFiles = []*os.File{goR}
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			goR.Close()
			time.Sleep(300 * time.Millisecond)
			if _, err := os.Stat(marker); err == nil {
				t.Fatal("the child ran before the go-ahead")
			}
			if c := kernelChildren(t, cmd.Process.Pid); len(c) != 0 {
				t.Fatalf("the kernel has children before the go-ahead: %+v", c)
			}
			if placed {
				if _, err := goW.Write([]byte{'g'}); err != nil {
					t.Fatal(err)
				}
			}
			goW.Close()
			code := exitCode(t, cmd.Wait())
			_, statErr := os.Stat(marker)
			if placed {
				if code != 5 || statErr != nil {
					t.Fatalf("exit %d (want 5), marker: %v; stderr: %s", code, statErr, stderr.String())
				}
				return
			}
			if code != ExitNotPlaced || statErr == nil {
				t.Fatalf("exit %d (want %d), marker: %v; stderr: %s", code, ExitNotPlaced, statErr, stderr.String())
			}
			if !strings.Contains(stderr.String(), "not placed") {
				t.Errorf("stderr does not say why: %s", stderr.String())
			}
		})
	}
}

func TestSignalForwarding(t *testing.T) {
	tests := []struct {
		sig  syscall.Signal
		want int
	}{
		{syscall.SIGTERM, 42},
		{syscall.SIGINT, 43},
	}
	for _, tc := range tests {
		t.Run(tc.sig.String(), func(t *testing.T) {
			t.Parallel()
			script := `trap 'echo got TERM; exit 42' TERM; trap 'echo got INT; exit 43' INT
echo ready
while :; do sleep 0.02; done`
			cmd := exec.Command(kernelBin, "--", "sh", "-c", script)
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
			var none []tracked
			readTracked(t, out, &none)
			if err := cmd.Process.Signal(tc.sig); err != nil {
				t.Fatal(err)
			}
			rest, _ := io.ReadAll(out)
			if code := exitCode(t, cmd.Wait()); code != tc.want {
				t.Fatalf("exit %d, want %d (output %q)", code, tc.want, rest)
			}
		})
	}
}

// TestTermGrace: a child that ignores a forwarded SIGTERM is killed after the grace.
func TestTermGrace(t *testing.T) {
	cmd := exec.Command(kernelBin, "--", "sh", "-c", `trap '' TERM; echo ready; sleep 1000`)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	var none []tracked
	readTracked(t, out, &none)
	start := time.Now()
	_ = cmd.Process.Signal(syscall.SIGTERM)
	code := exitCode(t, cmd.Wait())
	took := time.Since(start)
	if code != 128+9 {
		t.Fatalf("exit %d, want %d; stderr: %s", code, 128+9, stderr.String())
	}
	if took < termGrace || took > termGrace+time.Second {
		t.Fatalf("killed after %s, want the %s grace", took, termGrace)
	}
}

// TestChildRlimits: --rlimit-as and --rlimit-nproc become hard limits of the child (started
// through the kernel's helper mode), which is otherwise the same child: the kernel's direct
// child, leader of its own group, with the same fds and environment. The kernel itself runs
// without them.
func TestChildRlimits(t *testing.T) {
	py := python(t)
	cmd := exec.Command(kernelBin, "--rlimit-as", "268435456", "--rlimit-nproc", "4096", "--", py, "-c", `
import os, resource
print(resource.getrlimit(resource.RLIMIT_AS), resource.getrlimit(resource.RLIMIT_NPROC))
print(os.getpgrp() == os.getpid(), os.getppid())
print(open("/proc/self/cmdline").read().split("\0")[:2])
try:
    b = b"\x01" * (1 << 30)
except MemoryError:
    print("MemoryError")
`)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "KLBR_X=1", "SECRET=no"}
	stderr := newLogFile(t)
	cmd.Stderr = stderr.f
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%v; stderr: %s", err, stderr)
	}
	want := fmt.Sprintf("(268435456, 268435456) (4096, 4096)\nTrue %d\n['%s', '-c']\nMemoryError\n", cmd.Process.Pid, py)
	if string(out) != want {
		t.Fatalf("child printed\n%s\nwant\n%s", out, want)
	}
}

// TestKillNow: SIGUSR1 kills the whole tree at once, TERM-ignoring children included.
func TestKillNow(t *testing.T) {
	cmd, stderr, procs := startTree(t, nil, "trap '' TERM; exec sleep 1000")
	start := time.Now()
	if err := cmd.Process.Signal(syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	if code := exitCode(t, cmd.Wait()); code != 128+9 {
		t.Fatalf("exit %d, want 137; stderr: %s", code, stderr)
	}
	if took := time.Since(start); took > time.Second {
		t.Fatalf("took %s: no grace expected", took)
	}
	requireGone(t, procs, 0)
}
