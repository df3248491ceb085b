package systemd

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// notifySocket is a fake service manager: a unixgram socket at NOTIFY_SOCKET whose datagrams
// the test reads.
type notifySocket struct {
	conn *net.UnixConn
	msgs chan string
}

func listenNotify(t *testing.T) *notifySocket {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("NOTIFY_SOCKET", path)
	n := &notifySocket{conn: conn, msgs: make(chan string, 1024)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 4096)
		for {
			k, err := conn.Read(buf)
			if err != nil {
				return
			}
			n.msgs <- string(buf[:k])
		}
	}()
	t.Cleanup(func() { conn.Close(); <-done })
	return n
}

// next returns the next datagram, failing the test after a while.
func (n *notifySocket) next(t *testing.T) string {
	t.Helper()
	select {
	case m := <-n.msgs:
		return m
	case <-time.After(10 * time.Second):
		t.Fatal("no notification in 10s")
		return ""
	}
}

// none checks that nothing arrives for d.
func (n *notifySocket) none(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case m := <-n.msgs:
		t.Fatalf("unexpected notification %q", m)
	case <-time.After(d):
	}
}

func TestNotifierMessages(t *testing.T) {
	sock := listenNotify(t)
	n := NewNotifier(nil)
	if !n.Enabled() {
		t.Fatal("not enabled with NOTIFY_SOCKET set")
	}
	n.Status("starting:\n  opening the store")
	n.Status("starting: opening the store") // the same line again: skipped
	n.Ready("serving 1 session")
	n.Status("serving 1 session") // already said with READY=1
	n.Stopping("draining: waiting for 1 running cell")
	n.ExtendTimeout(15*time.Second, "draining: waiting for 1 running cell")
	for _, want := range []string{
		"STATUS=starting: opening the store",
		"READY=1\nSTATUS=serving 1 session",
		"STOPPING=1\nSTATUS=draining: waiting for 1 running cell",
		"EXTEND_TIMEOUT_USEC=15000000\nSTATUS=draining: waiting for 1 running cell",
	} {
		if got := sock.next(t); got != want {
			t.Fatalf("got %q, want %q", got, want)
		}
	}
	sock.none(t, 50*time.Millisecond)
}

func TestNotifierWithoutManager(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	t.Setenv("WATCHDOG_USEC", "1000")
	for _, n := range []*Notifier{NewNotifier(nil), nil, {}} {
		if n.Enabled() {
			t.Fatal("enabled without NOTIFY_SOCKET")
		}
		n.Ready("x")
		n.Status("y")
		n.Stopping("z")
		n.ExtendTimeout(time.Second, "")
		stop := n.StartWatchdog(t.Context(), nil)
		stop()
		stop()
		n.KeepExtending(time.Millisecond, func() string { return "" })()
	}
}

func TestNotifierUnreachableManager(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", filepath.Join(t.TempDir(), "nobody-listens"))
	n := NewNotifier(nil)
	n.Ready("serving") // logged once, never fatal
	n.Status("still serving")
}

func TestWatchdog(t *testing.T) {
	t.Run("pings at half the interval until stopped", func(t *testing.T) {
		sock := listenNotify(t)
		t.Setenv("WATCHDOG_USEC", "100000") // 100ms: a ping every 50ms
		t.Setenv("WATCHDOG_PID", strconv.Itoa(os.Getpid()))
		n := NewNotifier(nil)
		checks := 0
		start := time.Now()
		stop := n.StartWatchdog(t.Context(), func(ctx context.Context) error {
			checks++
			if _, ok := ctx.Deadline(); !ok {
				t.Error("the liveness check has no deadline")
			}
			return nil
		})
		for range 4 {
			if got := sock.next(t); got != "WATCHDOG=1" {
				t.Fatalf("got %q", got)
			}
		}
		if took := time.Since(start); took < 140*time.Millisecond || took > 2*time.Second {
			t.Errorf("4 pings took %s, want about 150ms", took)
		}
		stop()
		stop()
		sock.none(t, 150*time.Millisecond)
		if checks < 4 {
			t.Errorf("%d liveness checks for 4 pings", checks)
		}
	})
	t.Run("ends with its context", func(t *testing.T) {
		sock := listenNotify(t)
		t.Setenv("WATCHDOG_USEC", "40000")
		ctx, cancel := context.WithCancel(t.Context())
		stop := NewNotifier(nil).StartWatchdog(ctx, nil)
		sock.next(t)
		cancel()
		stop()
		for len(sock.msgs) > 0 {
			<-sock.msgs
		}
		sock.none(t, 100*time.Millisecond)
	})
	t.Run("no ping while the daemon does not answer", func(t *testing.T) {
		sock := listenNotify(t)
		t.Setenv("WATCHDOG_USEC", "40000")
		stop := NewNotifier(nil).StartWatchdog(t.Context(), func(ctx context.Context) error {
			<-ctx.Done() // a store that hangs
			return ctx.Err()
		})
		defer stop()
		sock.none(t, 200*time.Millisecond)
	})
	t.Run("for another process", func(t *testing.T) {
		sock := listenNotify(t)
		t.Setenv("WATCHDOG_USEC", "40000")
		t.Setenv("WATCHDOG_PID", strconv.Itoa(os.Getpid()+1))
		defer NewNotifier(nil).StartWatchdog(t.Context(), nil)()
		sock.none(t, 100*time.Millisecond)
	})
	t.Run("malformed interval", func(t *testing.T) {
		sock := listenNotify(t)
		t.Setenv("WATCHDOG_USEC", "soon")
		defer NewNotifier(nil).StartWatchdog(t.Context(), nil)()
		sock.none(t, 50*time.Millisecond)
	})
}

func TestKeepExtending(t *testing.T) {
	sock := listenNotify(t)
	n := NewNotifier(nil)
	i := 0
	stop := n.KeepExtending(30*time.Millisecond, func() string { i++; return "draining: waiting for " + strconv.Itoa(i) })
	if got := sock.next(t); got != "EXTEND_TIMEOUT_USEC=90000\nSTATUS=draining: waiting for 1" {
		t.Fatalf("first: %q", got)
	}
	if got := sock.next(t); !strings.HasPrefix(got, "EXTEND_TIMEOUT_USEC=90000\n") {
		t.Fatalf("second: %q", got)
	}
	stop()
	stop()
	for len(sock.msgs) > 0 {
		<-sock.msgs
	}
	sock.none(t, 100*time.Millisecond)
}

// Socket activation is tested in a child process: go-systemd takes the sockets only when
// LISTEN_PID is the taker's pid, so the child is started through a shell that sets it to its
// own pid before it execs this test binary (as systemd sets it between fork and exec).
const childEnv = "KLBR_SYSTEMD_TEST_CHILD"

// childReport is what the child found.
type childReport struct {
	Names     []string          `json:"names"`
	Addrs     map[string]string `json:"addrs"`
	Activated bool              `json:"activated"`
	Err       string            `json:"err"`
	EnvLeft   []string          `json:"env_left"` // LISTEN_* still set after TakeSockets
}

func TestTakeSocketsChild(t *testing.T) {
	if os.Getenv(childEnv) == "" {
		t.Skip("the child of TestTakeSockets")
	}
	var r childReport
	s, err := TakeSockets()
	if err != nil {
		r.Err = err.Error()
	} else {
		r.Names, r.Activated, r.Addrs = s.Names(), s.Activated(), map[string]string{}
		for _, name := range r.Names {
			for _, l := range s.Take(name) {
				r.Addrs[name] += l.Addr().Network() + ":" + l.Addr().String() + " "
				l.Close()
			}
		}
		if s.Activated() {
			r.Err = "still activated after taking every name"
		}
	}
	for _, v := range []string{"LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"} {
		if _, ok := os.LookupEnv(v); ok {
			r.EnvLeft = append(r.EnvLeft, v)
		}
	}
	b, _ := json.Marshal(r)
	os.WriteFile(os.Getenv(childEnv), b, 0o600)
}

func TestTakeSockets(t *testing.T) {
	dir := t.TempDir()
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer tcp.Close()
	unixL, err := net.Listen("unix", filepath.Join(dir, "control.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer unixL.Close()
	dgram, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: filepath.Join(dir, "dgram"), Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer dgram.Close()
	conn, err := net.Dial("tcp", tcp.Addr().String()) // a connected, not a listening, socket
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	file := func(f interface{ File() (*os.File, error) }) *os.File {
		t.Helper()
		fl, err := f.File()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { fl.Close() })
		return fl
	}
	tcpF, unixF := file(tcp.(*net.TCPListener)), file(unixL.(*net.UnixListener))
	dgramF, connF := file(dgram), file(conn.(*net.TCPConn))

	for _, tc := range []struct {
		name    string
		files   []*os.File
		env     []string // besides LISTEN_FDS
		pid     string   // LISTEN_PID: "self" for the child's own
		want    map[string]string
		wantErr string
	}{
		{name: "named", files: []*os.File{tcpF, unixF}, env: []string{"LISTEN_FDNAMES=http:control"}, pid: "self",
			want: map[string]string{"http": "tcp:" + tcp.Addr().String() + " ", "control": "unix:" + unixL.Addr().String() + " "}},
		{name: "two of a name", files: []*os.File{tcpF, tcpF}, env: []string{"LISTEN_FDNAMES=http:http"}, pid: "self",
			want: map[string]string{"http": "tcp:" + tcp.Addr().String() + " tcp:" + tcp.Addr().String() + " "}},
		{name: "unnamed", files: []*os.File{unixF}, pid: "self",
			want: map[string]string{"LISTEN_FD_3": "unix:" + unixL.Addr().String() + " "}},
		{name: "another process's sockets", files: []*os.File{tcpF}, env: []string{"LISTEN_FDNAMES=http"}, pid: "1",
			want: map[string]string{}},
		{name: "datagram socket", files: []*os.File{tcpF, dgramF}, env: []string{"LISTEN_FDNAMES=http:ingress"}, pid: "self",
			wantErr: `socket "ingress" (fd 4) passed by systemd: not a stream socket`},
		{name: "connection", files: []*os.File{connF}, env: []string{"LISTEN_FDNAMES=http"}, pid: "self",
			wantErr: `socket "http" (fd 3) passed by systemd: not a listening socket`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "report.json")
			pid := tc.pid
			if pid == "self" {
				pid = "$$"
			}
			cmd := exec.Command("/bin/sh", "-c", `LISTEN_PID=`+pid+` exec "$0" "$@"`, os.Args[0],
				"-test.run=^TestTakeSocketsChild$", "-test.count=1")
			cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), childEnv + "=" + out, "GORACE=atexit_sleep_ms=0",
				"LISTEN_FDS=" + strconv.Itoa(len(tc.files))}, tc.env...)
			cmd.ExtraFiles = tc.files
			if b, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("child: %v\n%s", err, b)
			}
			b, err := os.ReadFile(out)
			if err != nil {
				t.Fatal(err)
			}
			var r childReport
			if err := json.Unmarshal(b, &r); err != nil {
				t.Fatal(err)
			}
			if len(r.EnvLeft) > 0 {
				t.Errorf("left in the environment: %v", r.EnvLeft)
			}
			if tc.wantErr != "" {
				if !strings.Contains(r.Err, tc.wantErr) {
					t.Fatalf("error %q, want %q", r.Err, tc.wantErr)
				}
				return
			}
			if r.Err != "" {
				t.Fatal(r.Err)
			}
			if len(r.Addrs) != len(tc.want) {
				t.Fatalf("got %v, want %v", r.Addrs, tc.want)
			}
			for name, want := range tc.want {
				if r.Addrs[name] != want {
					t.Errorf("%s: got %q, want %q", name, r.Addrs[name], want)
				}
			}
		})
	}
}

func TestSocketsClose(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &Sockets{byName: map[string][]net.Listener{"http": {l}}}
	if !s.Activated() || s.Names()[0] != "http" {
		t.Fatal(s.Names())
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("accept after Close: %v", err)
	}
	if s.Activated() {
		t.Fatal("activated after Close")
	}
}
