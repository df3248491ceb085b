package kernel

import (
	"bufio"
	"bytes"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/resume"
)

// relay starts klbr-kernel --attach SOCK and attaches s through it; the returned stop
// drops that connection.
func relay(t *testing.T, s *resume.Stream, sock string) (stop func()) {
	t.Helper()
	cmd := exec.Command(kernelBin, "--attach", sock)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	c, err := resume.StartCommand(cmd)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { s.Attach(c); close(done) }()
	return func() { c.Close(); <-done }
}

// TestListenReattach: with --listen the child's protocol stream survives its connection:
// what the core writes while no connection is attached arrives once one is, and what the
// child answered is neither lost nor doubled; with no connection for --grace the tree is
// killed.
func TestListenReattach(t *testing.T) {
	py := python(t)
	script := `
import socket
s = socket.socket(fileno=3)
f = s.makefile("rwb", buffering=0)
n = 0
for line in f:
    n += 1
    s.sendall(b"echo %d:" % n + line)
`
	sock := filepath.Join(t.TempDir(), "protocol.sock")
	cmd := exec.Command(kernelBin, "--listen", sock, "--grace", "2s", "--", py, "-c", script)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	for deadline := time.Now().Add(10 * time.Second); ; {
		if _, err := exec.Command("test", "-S", sock).Output(); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no socket; stderr %s", stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	s := resume.New(resume.Config{})
	r := bufio.NewReader(s)
	stop := relay(t, s, sock)
	s.Write([]byte("a\n"))
	if l, err := r.ReadString('\n'); err != nil || l != "echo 1:a\n" {
		t.Fatalf("first line %q, %v", l, err)
	}
	stop()
	s.Write([]byte("b\n")) // while detached
	stop = relay(t, s, sock)
	if l, err := r.ReadString('\n'); err != nil || l != "echo 2:b\n" {
		t.Fatalf("after the reattach: %q, %v; stderr %s", l, err, stderr.String())
	}
	stop()
	select {
	case err := <-exited:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 128+9 {
			t.Fatalf("the kernel ended %v after its grace; want 137", err)
		}
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		<-exited // its stderr is written
		t.Fatalf("the kernel outlived its grace without a connection; stderr %s", stderr.String())
	}
	if !strings.Contains(stderr.String(), "no connection for 2s") {
		t.Fatalf("stderr does not say why: %s", stderr.String())
	}
	s.Close()
}

// TestAttachRefusesALink: the unit's directory is writable by its cells; a protocol.sock
// that is a symbolic link (to the login's service manager, to another unit's socket) is
// refused by the relay, which never connects to what it names.
func TestAttachRefusesALink(t *testing.T) {
	dir := t.TempDir()
	other := filepath.Join(dir, "other.sock")
	l, err := net.Listen("unix", other)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan struct{}, 1)
	go func() {
		if c, err := l.Accept(); err == nil {
			accepted <- struct{}{}
			c.Close()
		}
	}()
	link := filepath.Join(dir, "protocol.sock")
	if err := os.Symlink(other, link); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(kernelBin, "--attach", link).CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != ExitKernel {
		t.Fatalf("attach through a link: %v %s", err, out)
	}
	select {
	case <-accepted:
		t.Fatal("the relay connected to the socket a link named")
	default:
	}
	// A real socket at the path is reached.
	os.Remove(link)
	l2, err := net.Listen("unix", link)
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close()
	go func() {
		if c, err := l2.Accept(); err == nil {
			c.Write([]byte("hi"))
			c.Close()
		}
	}()
	// The relay ends when either side does (a relay whose SSH session is
	// gone has nothing to carry; the stream replays what was unread), so
	// its stdin stays open until the socket's side has ended.
	cmd := exec.Command(kernelBin, "--attach", link)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	out, err = cmd.Output()
	if err != nil || string(out) != "hi" {
		t.Fatalf("attach to a socket: %q %v", out, err)
	}
}
