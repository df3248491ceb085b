package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/api"
	"github.com/klbr-dev/klbr/internal/citest"
	"github.com/klbr-dev/klbr/internal/config"
	"github.com/klbr-dev/klbr/internal/localclient"
	"github.com/klbr-dev/klbr/internal/setup"
	"github.com/klbr-dev/klbr/internal/store"
)

// These tests run Run in a child process, the way systemd runs klbr-core: go-systemd takes
// the passed sockets only when LISTEN_PID is the taker's pid, so the child is started through
// a shell that sets it to its own pid and execs this test binary (TestDaemonChild), with the
// sockets as descriptors 3… and NOTIFY_SOCKET at a datagram socket the test reads. The test
// keeps its own copy of every socket, as systemd does, so connections made while no child
// runs wait in the socket's queue.

const childEnv = "KLBR_DAEMON_TEST_CHILD"

// TestDaemonChild is the child: klbr-core serve, configured by the environment.
func TestDaemonChild(t *testing.T) {
	if os.Getenv(childEnv) == "" {
		t.Skip("the child of the socket activation tests")
	}
	cfg, err := config.Load(os.LookupEnv)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child config:", err)
		os.Exit(3)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	hup, stopHup := NotifyHangup() // as klbr-core serve does
	defer stopHup()
	opts := Options{Hangup: hup, Ready: func(a Addrs) { fmt.Fprintf(os.Stderr, "READY http=%s control=%s\n", a.HTTP, a.Control) }}
	if f := os.Getenv(testClockEnv); f != "" {
		c := startTestClock(ctx, f)
		opts.Clock, opts.After = c.now, c.after
	}
	err = Run(ctx, cfg, log, opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "klbr-core:", err)
		os.Exit(3)
	}
}

// socket is one socket the test passes, under its FileDescriptorName.
type socket struct {
	name string
	l    net.Listener
	file *os.File
}

func tcpSocket(t *testing.T, name, addr string) socket {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	f, err := l.(*net.TCPListener).File()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close(); f.Close() })
	return socket{name, l, f}
}

// unixSocket makes a socket file with mode, as systemd's SocketMode= does.
func unixSocket(t *testing.T, name, path string, mode os.FileMode) socket {
	t.Helper()
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false) // the test checks what the child leaves
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
	f, err := l.File()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close(); f.Close() })
	return socket{name, l, f}
}

// notifySocket is a fake service manager's NOTIFY_SOCKET.
type notifySocket struct {
	path string
	msgs chan string
}

func listenNotify(t *testing.T) *notifySocket {
	t.Helper()
	path := filepath.Join(shortDir(t), "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	n := &notifySocket{path: path, msgs: make(chan string, 4096)}
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

// await returns the messages up to and including the first that match accepts.
func (n *notifySocket) await(t *testing.T, what string, match func(string) bool) []string {
	t.Helper()
	var seen []string
	deadline := time.After(60 * time.Second)
	for {
		select {
		case m := <-n.msgs:
			seen = append(seen, m)
			if match(m) {
				return seen
			}
		case <-deadline:
			t.Fatalf("no %s in 60s; got %q", what, seen)
		}
	}
}

// shortDir is a temporary directory with a path short enough for Unix sockets.
func shortDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "klbr-sd-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// child is a running TestDaemonChild.
type child struct {
	cmd    *exec.Cmd
	mu     sync.Mutex
	log    bytes.Buffer
	exited chan error
}

func (c *child) Write(p []byte) (int, error) { c.mu.Lock(); defer c.mu.Unlock(); return c.log.Write(p) }

func (c *child) String() string { c.mu.Lock(); defer c.mu.Unlock(); return c.log.String() }

func (c *child) wait(t *testing.T) error {
	t.Helper()
	select {
	case err := <-c.exited:
		return err
	case <-time.After(60 * time.Second):
		t.Fatalf("the daemon did not exit:\n%s", c)
		return nil
	}
}

// startChild starts TestDaemonChild with socks as its descriptors 3… and env (a later value
// of a variable wins).
func startChild(t testing.TB, socks []socket, env ...string) *child {
	t.Helper()
	return startChildWith(t, exec.Command("/bin/sh", "-c", `LISTEN_PID=$$ exec "$0" "$@"`, os.Args[0], "-test.run=^TestDaemonChild$", "-test.count=1"), socks, env...)
}

// startChildWithoutCgroups starts TestDaemonChild as startChild does, but where it finds no
// cgroup file system (an empty tmpfs over /sys/fs/cgroup in a mount namespace of its own),
// so its workers are placed with rlimits. Daemons in cgroup mode name their cgroups after
// session and generation beside their own: two on one machine (another package's tests)
// would take each other's.
func startChildWithoutCgroups(t testing.TB, socks []socket, env ...string) *child {
	t.Helper()
	if _, err := exec.LookPath("unshare"); err != nil || os.Geteuid() != 0 {
		return startChild(t, socks, env...) // no cgroup mode for this user anyway
	}
	return startChildWith(t, exec.Command("unshare", "--mount", "--propagation", "private", "/bin/sh", "-c",
		`mount -t tmpfs klbr-test /sys/fs/cgroup && LISTEN_PID=$$ exec "$0" "$@"`, os.Args[0], "-test.run=^TestDaemonChild$", "-test.count=1"),
		socks, env...)
}

func startChildWith(t testing.TB, cmd *exec.Cmd, socks []socket, env ...string) *child {
	t.Helper()
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), childEnv + "=1", "GORACE=atexit_sleep_ms=0"}
	if len(socks) > 0 {
		var names []string
		for _, s := range socks {
			names = append(names, s.name)
			cmd.ExtraFiles = append(cmd.ExtraFiles, s.file)
		}
		cmd.Env = append(cmd.Env, "LISTEN_FDS="+strconv.Itoa(len(socks)), "LISTEN_FDNAMES="+strings.Join(names, ":"))
	}
	cmd.Env = append(cmd.Env, env...)
	c := &child{cmd: cmd, exited: make(chan error, 1)}
	cmd.Stdout, cmd.Stderr = c, c
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { c.exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		if t.Failed() {
			t.Logf("daemon log:\n%s", c)
		}
	})
	return c
}

// instance is a data directory and the environment of a daemon serving it.
func instance(t testing.TB) (dir string, env []string) {
	t.Helper()
	root := shortDir(t)
	dir = filepath.Join(root, "data")
	if _, err := setup.Init(t.Context(), dir); err != nil {
		t.Fatal(err)
	}
	return dir, []string{"KLBR_DATA_DIR=" + dir, "KLBR_WORKSPACE=" + root, "KLBR_BIND_ADDR=127.0.0.1:0"}
}

func get(t *testing.T, c *http.Client, url string) (int, string) {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func unixHTTP(path string) *http.Client {
	return &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", path)
	}}}
}

func TestSocketActivation(t *testing.T) {
	data, env := instance(t)
	run := shortDir(t)
	httpS := tcpSocket(t, "http", "127.0.0.1:0")
	ctl := filepath.Join(run, "control.sock")
	ctlS := unixSocket(t, "control", ctl, 0o640)
	ingS := unixSocket(t, "ingress", filepath.Join(run, "ingress.sock"), 0o660)
	sock := listenNotify(t)
	env = append(env, "KLBR_CONTROL_SOCKET="+ctl, "NOTIFY_SOCKET="+sock.path, "WATCHDOG_USEC=200000",
		EnvSystemdBus+"=unix:path="+filepath.Join(run, "no-such-bus"))
	socks := []socket{httpS, ctlS, ingS}
	d := startChild(t, socks, env...)

	msgs := sock.await(t, "READY=1", func(m string) bool { return strings.HasPrefix(m, "READY=1") })
	if msgs[0] != "STATUS=starting: opening the store" {
		t.Errorf("first notification %q", msgs[0])
	}
	ready := msgs[len(msgs)-1]
	// No klbr-kernel on this daemon's PATH: it serves, and says why cells cannot run.
	if !strings.HasPrefix(ready, "READY=1\nSTATUS=serving 1 session; cells cannot run: klbr-kernel is neither") {
		t.Errorf("READY: %q", ready)
	}
	// Ready means served: every listener answers at once.
	web := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	if code, body := get(t, web, "http://"+httpS.l.Addr().String()+"/healthz"); code != 200 || !strings.Contains(body, "ok") {
		t.Fatalf("healthz: %d %s", code, body)
	}
	c := localclient.New(ctl)
	defer c.Close()
	st, err := c.Status(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if st.PID != d.cmd.Process.Pid || st.Sessions[0].ID != "default" {
		t.Fatalf("status: %+v", st)
	}
	if !strings.Contains(strings.Join(st.PlacementNotes, "\n"), "no-such-bus") {
		t.Errorf("placement did not try %s: %q", EnvSystemdBus, st.PlacementNotes)
	}
	code, body := get(t, unixHTTP(ingS.l.Addr().String()), "http://ingress/v1/inputs")
	var e api.Error
	// The ingress API serves the inherited socket: admission is POST only.
	if json.Unmarshal([]byte(body), &e); code != 404 || e.Error.Code != api.CodeNotFound || !strings.Contains(e.Error.Message, "no such ingress endpoint") {
		t.Fatalf("ingress: %d %s", code, body)
	}
	// The watchdog: pings every 100ms for WATCHDOG_USEC=200ms.
	start := time.Now()
	for range 3 {
		sock.await(t, "WATCHDOG=1", func(m string) bool { return m == "WATCHDOG=1" })
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("3 watchdog pings took %s", took)
	}
	// systemd's socket file is left as systemd made it, and nothing is bound beside it.
	checkMode := func() {
		t.Helper()
		if fi, err := os.Stat(ctl); err != nil || fi.Mode().Perm() != 0o640 || fi.Mode().Type() != os.ModeSocket {
			t.Fatalf("control socket: %v %v", fi, err)
		}
	}
	checkMode()
	if _, err := os.Stat(filepath.Join(data, "control.sock")); !os.IsNotExist(err) {
		t.Errorf("a control socket was bound in the data directory: %v", err)
	}

	d.cmd.Process.Signal(syscall.SIGTERM)
	stopping := sock.await(t, "STOPPING=1", func(m string) bool { return strings.HasPrefix(m, "STOPPING=1") })
	if got := stopping[len(stopping)-1]; got != "STOPPING=1\nSTATUS=draining: waiting for accepted work" {
		t.Errorf("STOPPING: %q", got)
	}
	if err := d.wait(t); err != nil {
		t.Fatalf("exit: %v\n%s", err, d)
	}
	if !strings.Contains(d.String(), "drained") || strings.Contains(d.String(), "did not close cleanly") {
		t.Errorf("drain log:\n%s", d)
	}
	checkMode()

	// A restart drops nothing: a request sent while no daemon runs waits in the socket's
	// queue, and the next daemon answers it.
	answered := make(chan string, 1)
	go func() {
		resp, err := web.Get("http://" + httpS.l.Addr().String() + "/healthz")
		if err != nil {
			answered <- err.Error()
			return
		}
		resp.Body.Close()
		answered <- resp.Status
	}()
	time.Sleep(100 * time.Millisecond)
	d = startChild(t, socks, env...)
	select {
	case got := <-answered:
		if got != "200 OK" {
			t.Fatalf("the request made between two daemons: %s", got)
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("the request made between two daemons was not answered\n%s", d)
	}
	d.cmd.Process.Signal(syscall.SIGTERM)
	if err := d.wait(t); err != nil {
		t.Fatalf("exit: %v\n%s", err, d)
	}
	checkMode()
}

func TestSocketActivationRefusals(t *testing.T) {
	_, env := instance(t)
	run := shortDir(t)
	for _, tc := range []struct {
		name  string
		socks func() []socket
		want  string
	}{
		{"http not on loopback", func() []socket { return []socket{tcpSocket(t, "http", "0.0.0.0:0")} },
			"refused: klbr serves only loopback"},
		{"http over a Unix socket", func() []socket { return []socket{unixSocket(t, "http", filepath.Join(run, "h.sock"), 0o600)} },
			"is not a TCP socket"},
		{"control over TCP", func() []socket { return []socket{tcpSocket(t, "control", "127.0.0.1:0")} },
			"the control socket 127.0.0.1:"},
		{"an unknown name", func() []socket {
			return []socket{tcpSocket(t, "http", "127.0.0.1:0"), tcpSocket(t, "metrics", "127.0.0.1:0")}
		}, "systemd passed sockets named metrics; klbr-core serves only"},
		{"two control sockets", func() []socket {
			return []socket{unixSocket(t, "control", filepath.Join(run, "c1.sock"), 0o600), unixSocket(t, "control", filepath.Join(run, "c2.sock"), 0o600)}
		}, "2 control and 0 ingress sockets passed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := startChild(t, tc.socks(), env...)
			err := d.wait(t)
			if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 3 {
				t.Fatalf("exit %v, want 3\n%s", err, d)
			}
			if !strings.Contains(d.String(), tc.want) {
				t.Fatalf("the error does not say %q:\n%s", tc.want, d)
			}
		})
	}
	t.Run("http not on loopback says why", func(t *testing.T) {
		d := startChild(t, []socket{tcpSocket(t, "http", "0.0.0.0:0")}, env...)
		d.wait(t)
		if !strings.Contains(d.String(), "klbr serves only loopback") || !strings.Contains(d.String(), "ListenStream=127.0.0.1:8765") {
			t.Fatalf("%s", d)
		}
	})
}

// Without LISTEN_FDS, or with sockets meant for another process, klbr-core binds its own.
func TestWithoutActivation(t *testing.T) {
	data, env := instance(t)
	for _, tc := range []struct {
		name  string
		socks []socket
		extra []string
	}{
		{"no sockets", nil, nil},
		{"another process's sockets", []socket{tcpSocket(t, "http", "127.0.0.1:0")}, []string{"LISTEN_PID=1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := startChild(t, tc.socks, append(append([]string{}, env...), tc.extra...)...)
			ctl := filepath.Join(data, "control.sock")
			c := localclient.New(ctl)
			defer c.Close()
			deadline := time.Now().Add(60 * time.Second)
			for {
				if _, err := c.Status(t.Context()); err == nil {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("no daemon on %s:\n%s", ctl, d)
				}
				time.Sleep(20 * time.Millisecond)
			}
			if fi, err := os.Stat(ctl); err != nil || fi.Mode().Perm() != 0o600 {
				t.Fatalf("control socket: %v %v", fi, err)
			}
			d.cmd.Process.Signal(syscall.SIGTERM)
			if err := d.wait(t); err != nil {
				t.Fatalf("exit: %v\n%s", err, d)
			}
			if _, err := os.Stat(ctl); !os.IsNotExist(err) {
				t.Fatalf("the control socket it bound is left: %v", err)
			}
		})
	}
}

var kernelOnce struct {
	sync.Once
	dir string
	err error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if kernelOnce.dir != "" {
		os.RemoveAll(kernelOnce.dir)
	}
	os.Exit(code)
}

// kernelDir is a directory holding a freshly built klbr-kernel, for PATH.
func kernelDir(t testing.TB) string {
	t.Helper()
	kernelOnce.Do(func() {
		kernelOnce.dir, kernelOnce.err = os.MkdirTemp("", "klbr-kernel-")
		if kernelOnce.err != nil {
			return
		}
		out, err := exec.Command("go", "build", "-o", filepath.Join(kernelOnce.dir, "klbr-kernel"), "../../cmd/klbr-kernel").CombinedOutput()
		if err != nil {
			kernelOnce.err = fmt.Errorf("go build klbr-kernel: %v\n%s", err, out)
		}
	})
	if kernelOnce.err != nil {
		t.Fatal(kernelOnce.err)
	}
	return kernelOnce.dir
}

func requirePython(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("python3"); err != nil {
		citest.SkipOrFail(t, "python3 is missing")
	}
}

// A drain that waits for a running cell tells systemd so: STOPPING=1, then
// EXTEND_TIMEOUT_USEC= with the cell count, until the cell is recorded.
func TestDrainNotifiesSystemd(t *testing.T) {
	requirePython(t)
	data, env := instance(t)
	ctl := filepath.Join(shortDir(t), "control.sock")
	sock := listenNotify(t)
	env = append(env, "KLBR_CONTROL_SOCKET="+ctl, "NOTIFY_SOCKET="+sock.path, "PATH="+kernelDir(t)+":"+os.Getenv("PATH"))
	// Only the control socket comes from systemd; http is bound by the daemon.
	d := startChildWithoutCgroups(t, []socket{unixSocket(t, "control", ctl, 0o600)}, env...)
	sock.await(t, "READY=1", func(m string) bool { return strings.HasPrefix(m, "READY=1") })

	c := localclient.New(ctl)
	defer c.Close()
	type result struct {
		outcome string
		err     error
	}
	done := make(chan result, 1)
	go func() {
		res, err := c.Exec(context.Background(), "default", api.ExecRequest{Code: "import time\ntime.sleep(1.5)\n1"})
		if err != nil {
			done <- result{err: err}
			return
		}
		done <- result{outcome: res.Outcome.Status + " " + *res.Outcome.Value}
	}()
	running := sock.await(t, "a running cell in STATUS=", func(m string) bool {
		return strings.HasPrefix(m, "STATUS=serving 1 session, 1 cell running (placement: ")
	})
	t.Log(running[len(running)-1])
	// The cell is counted as soon as it is asked for; signal once it runs
	// (its kernel started and it is journaled), not while the kernel starts.
	deadline := time.Now().Add(30 * time.Second)
	for started := false; !started; {
		page, err := c.Records(t.Context(), "default", 0, 100)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range page.Records {
			started = started || r.Kind == "cell.started"
		}
		if time.Now().After(deadline) {
			t.Fatalf("the cell did not start:\n%s", d)
		}
		time.Sleep(10 * time.Millisecond)
	}
	d.cmd.Process.Signal(syscall.SIGTERM)
	msgs := sock.await(t, "the end of the wait", func(m string) bool { return m == "STATUS=draining: stopping workers" })
	want := []string{
		"STOPPING=1\nSTATUS=draining: waiting for 1 running cell",
		"EXTEND_TIMEOUT_USEC=15000000\nSTATUS=draining: waiting for 1 running cell",
	}
	if len(msgs) < 3 || msgs[0] != want[0] || msgs[1] != want[1] {
		t.Fatalf("drain notifications %q, want %q first", msgs, want)
	}
	sock.await(t, "the last status", func(m string) bool { return m == "STATUS=draining: closing connections" })
	r := <-done
	if r.err != nil || r.outcome != "ok 1" {
		t.Fatalf("the cell: %q, error %v", r.outcome, r.err)
	}
	if err := d.wait(t); err != nil {
		t.Fatalf("exit: %v\n%s", err, d)
	}
	st, err := store.Open(t.Context(), data, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	recs, err := st.Records(t.Context(), "default", 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, r := range recs {
		kinds = append(kinds, r.Kind)
	}
	if !strings.Contains(strings.Join(kinds, " "), "cell.finished") {
		t.Fatalf("the cell's outcome is not recorded: %v", kinds)
	}
}
