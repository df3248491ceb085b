package kernel

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/resume"
)

// frameEcho is a child that answers each frame of the worker protocol's
// framing with "echo N:" and its payload; "later" is answered half a second
// late, as "late".
const frameEcho = `
import socket, struct, time
s = socket.socket(fileno=3)
f = s.makefile("rwb", buffering=0)
def read(n):
    b = b""
    while len(b) < n:
        c = f.read(n - len(b))
        if not c:
            raise SystemExit(0)
        b += c
    return b
n = 0
while True:
    (size,) = struct.unpack(">I", read(4))
    p = read(size)
    n += 1
    if p == b"later":
        time.sleep(0.5)
        p = b"late"
    out = b"echo %d:" % n + p
    s.sendall(struct.pack(">I", len(out)) + out)
`

func writeFrame(w io.Writer, p string) {
	w.Write(binary.BigEndian.AppendUint32(nil, uint32(len(p))))
	w.Write([]byte(p))
}

func readFrame(r io.Reader) (string, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return "", err
	}
	b := make([]byte, binary.BigEndian.Uint32(hdr[:]))
	_, err := io.ReadFull(r, b)
	return string(b), err
}

// startListen starts klbr-kernel --listen SOCK with grace running py -c
// script and waits for its socket.
func startListen(t *testing.T, grace string, script string) (sock string, stderr *bytes.Buffer, exited chan struct{}) {
	t.Helper()
	sock = filepath.Join(t.TempDir(), "protocol.sock")
	cmd := exec.Command(kernelBin, "--listen", sock, "--grace", grace, "--", python(t), "-c", script)
	stderr = &bytes.Buffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited = make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() { cmd.Process.Kill(); <-exited })
	for deadline := time.Now().Add(10 * time.Second); ; {
		if fi, err := os.Stat(sock); err == nil && fi.Mode()&os.ModeSocket != 0 {
			return sock, stderr, exited
		}
		if time.Now().After(deadline) {
			t.Fatalf("no socket; stderr %s", stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestListenNewEpoch: a klbr-core that restarted takes the worker over with a new epoch
// of its stream. What was in flight when its predecessor died is dropped whole, frame by
// frame: half a frame the old one had sent never reaches the child (which would read it
// and the new one's first frame as garbage), and the child's frame written while no one
// was attached never reaches the new one. The child's state is kept: it counts on.
func TestListenNewEpoch(t *testing.T) {
	sock, stderr, _ := startListen(t, "30s", frameEcho)
	old := resume.New(resume.Config{})
	stop := relay(t, old, sock)
	writeFrame(old, "a")
	if l, err := readFrame(old); err != nil || l != "echo 1:a" {
		t.Fatalf("first frame %q, %v", l, err)
	}
	writeFrame(old, "later")                           // answered while no one is attached
	old.Write([]byte{0, 0, 0, 10, 'h', 'a', 'l', 'f'}) // the old klbr-core dies mid-frame
	time.Sleep(100 * time.Millisecond)
	stop()
	time.Sleep(time.Second) // "late" is written, unacknowledged

	fresh := resume.New(resume.Config{NewEpoch: true})
	stop = relay(t, fresh, sock)
	defer stop()
	writeFrame(fresh, "b")
	got := make(chan string, 1)
	go func() { l, err := readFrame(fresh); got <- fmt.Sprintf("%q %v", l, err) }()
	select {
	case l := <-got:
		if l != `"echo 3:b" <nil>` {
			t.Fatalf("the new epoch's first frame %s; want the child's answer to b, counted on (stderr %s)", l, stderr.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("no answer in the new epoch: the child is stuck in a frame cut by it (stderr %s)", stderr.String())
	}
	if fresh.ID() == old.ID() {
		t.Fatal("the new epoch kept the old stream's ID")
	}
}

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
	sock := filepath.Join(t.TempDir(), "protocol.sock")
	cmd := exec.Command(kernelBin, "--listen", sock, "--grace", "2s", "--", py, "-c", frameEcho)
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
	writeFrame(s, "a")
	if l, err := readFrame(r); err != nil || l != "echo 1:a" {
		t.Fatalf("first frame %q, %v", l, err)
	}
	stop()
	writeFrame(s, "b") // while detached
	stop = relay(t, s, sock)
	if l, err := readFrame(r); err != nil || l != "echo 2:b" {
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

// TestListenHandle: a --listen kernel holds its socket's own inode (O_PATH): the one entry
// of /proc/PID/fd that names the socket reaches the kernel, and still does once a cell has
// put a link to another socket at the socket's path; the other socket is never reached.
func TestListenHandle(t *testing.T) {
	py := python(t)
	dir := t.TempDir()
	sock := filepath.Join(dir, "protocol.sock")
	cmd := exec.Command(kernelBin, "--listen", sock, "--grace", "30s", "--", py, "-c", "import time; time.sleep(60)")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	var handle string
	for deadline := time.Now().Add(10 * time.Second); handle == ""; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no entry of the kernel's /proc/PID/fd names its socket")
		}
		ents, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", cmd.Process.Pid))
		for _, e := range ents {
			p := fmt.Sprintf("/proc/%d/fd/%s", cmd.Process.Pid, e.Name())
			if target, err := os.Readlink(p); err == nil && target == sock {
				handle = p
			}
		}
	}
	hello := func() string {
		c, err := net.Dial("unix", handle)
		if err != nil {
			t.Fatalf("connect through %s: %v", handle, err)
		}
		defer c.Close()
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		b := make([]byte, 8)
		if _, err := io.ReadFull(c, b); err != nil {
			t.Fatalf("read the hello through %s: %v", handle, err)
		}
		return string(b)
	}
	if h := hello(); h != "KLBRRS01" {
		t.Fatalf("through the handle: %q, want the kernel's hello", h)
	}
	decoy, err := net.Listen("unix", filepath.Join(dir, "decoy.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer decoy.Close()
	reached := make(chan struct{}, 1)
	go func() {
		if c, err := decoy.Accept(); err == nil {
			reached <- struct{}{}
			c.Close()
		}
	}()
	if err := os.Rename(sock, filepath.Join(dir, "moved.sock")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(dir, "decoy.sock"), sock); err != nil {
		t.Fatal(err)
	}
	if h := hello(); h != "KLBRRS01" {
		t.Fatalf("through the handle after the link: %q, want the kernel's hello", h)
	}
	select {
	case <-reached:
		t.Fatal("the handle reached the socket the link names")
	default:
	}
}

// TestListenStoppedWithoutPeer: a unit stopped while no connection is attached (a
// generation left over from a dead klbr-core, stopped by its successor) ends at once: the
// kernel does not wait out its grace for a peer to take the child's last frames.
func TestListenStoppedWithoutPeer(t *testing.T) {
	sock, stderr, exited := startListen(t, "60s", frameEcho)
	s := resume.New(resume.Config{})
	stop := relay(t, s, sock)
	writeFrame(s, "a")
	if l, err := readFrame(s); err != nil || l != "echo 1:a" {
		t.Fatalf("first frame %q, %v", l, err)
	}
	stop()
	time.Sleep(200 * time.Millisecond)
	pid, _ := strconv.Atoi(strings.TrimSpace(string(must(exec.Command("pgrep", "-f", "--", "--listen "+sock).Output()))))
	if pid == 0 {
		t.Fatal("no kernel process")
	}
	began := time.Now()
	syscall.Kill(pid, syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(20 * time.Second):
		t.Fatalf("the kernel outlived a stop without a peer by 20 s (stderr %s)", stderr.String())
	}
	t.Logf("stopped in %s", time.Since(began).Round(time.Millisecond))
}

func must(b []byte, err error) []byte { return b }
