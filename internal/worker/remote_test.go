package worker

import (
	"context"
	"encoding/json"
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

	"github.com/klbr-dev/klbr/internal/artifacts"
	"github.com/klbr-dev/klbr/internal/config"
	"github.com/klbr-dev/klbr/internal/hosts"
	"github.com/klbr-dev/klbr/internal/hosttest"
	"github.com/klbr-dev/klbr/internal/workertest"
)

// remoteLab boots a worker host with this build's klbr-kernel on its PATH
// and returns an engine that knows it as "lab".
func remoteLab(t testing.TB) (*hosttest.Host, *hosts.Engine) {
	t.Helper()
	env = workertest.Setup(t)
	h := hosttest.Start(t)
	b, err := os.ReadFile(env.Kernel)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(h.BinDir, "klbr-kernel"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	tg, err := config.ParseSSHTarget(h.SSH())
	if err != nil {
		t.Fatal(err)
	}
	e, err := hosts.New(hosts.Config{Hosts: map[string]hosts.Host{"lab": {Name: "lab", Target: tg, IdentityFile: h.IdentityFile,
		KnownHostsFile: h.KnownHostsFile, MaxJobs: 2, MemoryMaxBytes: 1 << 30, TasksMax: 256, CPUQuotaPct: 200,
		Wall: time.Hour, WorkDir: h.WorkDir}}, ConnectTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return h, e
}

// startRemote sends the runtime (once per hash) and starts generation gen of
// session s1's workbench on the lab host.
func startRemote(t testing.TB, e *hosts.Engine, gen int64) (*Worker, int64) {
	t.Helper()
	return startRemoteAs(t, e, gen, func(u hosts.WorkerUnit) Remote { return u })
}

// pipeUnit hides a WorkerUnit's Resumable side: its worker is the piped
// SSH session of before (systemd-run --pipe, --protocol-stdio), the
// baseline of the benchmark.
type pipeUnit struct{ u hosts.WorkerUnit }

func (p pipeUnit) Command(ctx context.Context, argv, env []string) (*exec.Cmd, error) {
	return p.u.Command(ctx, argv, env)
}
func (p pipeUnit) Stop(ctx context.Context) error { return p.u.Stop(ctx) }

// relayUnit hides a WorkerUnit's Forward: each of its connections is a
// session running the relay (klbr-kernel --attach), the way before
// forwarding.
type relayUnit struct{ u hosts.WorkerUnit }

func (r relayUnit) Command(ctx context.Context, argv, env []string) (*exec.Cmd, error) {
	return r.u.Command(ctx, argv, env)
}
func (r relayUnit) Stop(ctx context.Context) error { return r.u.Stop(ctx) }
func (r relayUnit) Serve(ctx context.Context, argv, env []string) error {
	return r.u.Serve(ctx, argv, env)
}
func (r relayUnit) Attach(ctx context.Context) (*exec.Cmd, error)   { return r.u.Attach(ctx) }
func (r relayUnit) Grace() time.Duration                            { return r.u.Grace() }
func (r relayUnit) Tail(ctx context.Context, n int) ([]byte, error) { return r.u.Tail(ctx, n) }

func startRemoteAs(t testing.TB, e *hosts.Engine, gen int64, as func(hosts.WorkerUnit) Remote) (*Worker, int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	tree, err := hosts.PackTree(env.Runtime)
	if err != nil {
		t.Fatal(err)
	}
	src, sent, err := e.PutTree(ctx, "lab", tree)
	if err != nil {
		t.Fatal(err)
	}
	store, err := artifacts.New(filepath.Join(t.TempDir(), "artifacts"))
	if err != nil {
		t.Fatal(err)
	}
	unit := hosts.WorkerUnitName(RoleWorkbench, "s1", gen)
	w, err := Start(ctx, Spec{Role: RoleWorkbench, Session: "s1", Generation: gen,
		Kernel: "klbr-kernel", Python: "python3", RuntimeSrc: src, Artifacts: store,
		Remote: as(hosts.WorkerUnit{Engine: e, Host: "lab", Name: unit}), InterruptGrace: 500 * time.Millisecond})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(w.Kill)
	return w, sent
}

func TestRemoteWorkbench(t *testing.T) {
	h, e := remoteLab(t)
	netns, err := h.NetNS()
	if err != nil {
		t.Fatal(err)
	}
	w, sent := startRemote(t, e, 1)
	if sent == 0 {
		t.Fatal("the first start sent no runtime bytes")
	}
	o := run(t, w, "e1", "import os\nprint(os.readlink('/proc/self/ns/net'))\nprint(open('/proc/self/cgroup').read())\nx = 1")
	if o.Status != "ok" || !strings.Contains(text(o), netns) || !strings.Contains(text(o), "klbr.slice/klbr-workbench-s1-1.service") {
		t.Fatalf("the cell did not run in the host's unit (host netns %s): %+v %q\n%s", netns, o, text(o), w.Diagnostics())
	}
	if o := run(t, w, "e2", "x + 1"); o.Status != "ok" || o.Value == nil || *o.Value != "2" {
		t.Fatalf("x across cells: %+v", o)
	}

	// The sandbox on the host: the unit's own directory is writable, the
	// cache only readable, another unit's directory and the login's ~/.ssh
	// out of reach, and no capability even as root.
	other := filepath.Join(h.WorkDir, "klbr-job-9-1.service")
	if err := os.MkdirAll(other, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(other, "secret"), []byte("s"), 0o600); err != nil {
		t.Fatal(err)
	}
	probe := `import os
def tryit(f):
    try:
        f()
        return "ok"
    except OSError:
        return "denied"
home = os.path.expanduser("~")
print("own", tryit(lambda: open("mine", "w").write("m")))
print("other", tryit(lambda: open(%q).read()))
print("cache", tryit(lambda: open(os.environ["PYTHONPATH"].split(":")[0] + "/planted", "w")))
print("ssh", tryit(lambda: os.listdir(home + "/.ssh")))
print("caps", [l for l in open("/proc/self/status") if l.startswith("CapEff")][0].split()[1])
`
	o = run(t, w, "e2b", fmt.Sprintf(probe, filepath.Join(other, "secret")))
	for _, want := range []string{"own ok", "other denied", "cache denied", "ssh denied", "caps 0000000000000000"} {
		if !strings.Contains(text(o), want) {
			t.Fatalf("sandbox on the host: want %q in\n%s", want, text(o))
		}
	}

	// A host request of the remote cell is answered here, by klbr-core.
	var asked Request
	h1 := handlerFunc(func(ctx context.Context, r Request) (json.RawMessage, error) {
		asked = r
		return json.RawMessage(`{"hits": [{"text": "answered at home"}]}`), nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	o, err = w.Execute(ctx, "e3", "import klbr._sdk as sdk\n(await sdk.request('history.search', {'query': 'hi'}))['hits'][0]['text']", h1)
	if err != nil || o.Status != "ok" || o.Value == nil || *o.Value != "'answered at home'" || asked.Op != "history.search" {
		t.Fatalf("host request from the remote cell: %+v %v (asked %+v)", o, err, asked)
	}

	// Its connection is forwarded by the SSH connection itself: no relay
	// process is on the path.
	if children("--attach") {
		t.Fatal("a relay (klbr-kernel --attach) carries the forwarded worker's connection")
	}

	// A reset stops the remote unit; the next generation reuses the cached runtime.
	if units, err := h.Units("klbr-workbench-*"); err != nil || len(units) != 1 || units[0] != "klbr-workbench-s1-1.service" {
		t.Fatalf("units on the host while the worker runs: %v %v", units, err)
	}
	w.Kill()
	if units, err := h.Units("klbr-workbench-*"); err != nil || len(units) != 0 {
		t.Fatalf("units left on the host after the reset: %v %v", units, err)
	}
	w2, sent := startRemoteAs(t, e, 2, func(u hosts.WorkerUnit) Remote { return relayUnit{u} })
	if sent != 0 {
		t.Fatalf("the second start sent %d runtime bytes, want 0", sent)
	}
	if o := run(t, w2, "e4", "'x' in dir()"); o.Status != "ok" || o.Value == nil || *o.Value != "False" {
		t.Fatalf("a new generation kept the old heap: %+v", o)
	}

	// Through the relay: klbr-core's connection to the unit dropped (its SSH
	// session killed, nothing stopped): the unit runs on under the host's
	// systemd, the worker is reattached over a new session and keeps its heap.
	run(t, w2, "e5", "y = 5")
	killChildren(t, "--attach")
	if o := run(t, w2, "e6", "y + 1"); o.Status != "ok" || o.Value == nil || *o.Value != "6" {
		t.Fatalf("after its session was killed, the worker was not reattached: %+v\n%s", o, w2.Diagnostics())
	}
	if units, err := h.Units("klbr-workbench-*"); err != nil || len(units) != 1 {
		t.Fatalf("units on the host after the reattach: %v %v", units, err)
	}
}

// killChildren SIGKILLs this test's child processes whose command line
// contains pattern (never another test's).
func killChildren(t testing.TB, pattern string) int {
	t.Helper()
	out, _ := exec.Command("pgrep", "-P", strconv.Itoa(os.Getpid()), "-f", "--", pattern).Output()
	n := 0
	for _, f := range strings.Fields(string(out)) {
		if pid, err := strconv.Atoi(f); err == nil && syscall.Kill(pid, syscall.SIGKILL) == nil {
			n++
		}
	}
	if n == 0 {
		t.Fatalf("no child process matches %q", pattern)
	}
	return n
}

func children(pattern string) bool {
	return exec.Command("pgrep", "-P", strconv.Itoa(os.Getpid()), "-f", "--", pattern).Run() == nil
}

// TestRemoteWorkbenchReattached: the host's link goes down while a cell
// runs, long enough for the SSH connection to be given up on both sides;
// when it returns, the worker is reattached, not restarted: the cell
// finishes with its whole output, and a variable set before the drop is
// still there. A killed SSH master is made again the same way.
func TestRemoteWorkbenchReattached(t *testing.T) {
	h, e := remoteLab(t)
	w, _ := startRemote(t, e, 1)
	run(t, w, "e1", "x = 41")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	type result struct {
		o   *Outcome
		err error
	}
	res := make(chan result, 1)
	go func() {
		o, err := w.Execute(ctx, "e2", "import time\nfor i in range(30):\n    print('tick', i, flush=True)\n    time.sleep(1)\nprint('done', x)", nil)
		res <- result{o, err}
	}()
	time.Sleep(2 * time.Second)
	h.SetLink(t, false)
	t.Cleanup(func() { h.SetLink(t, true) })
	// The master gives the connection up after about 15 s of silence.
	for deadline := time.Now().Add(time.Minute); children("ControlPersist=no"); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the SSH master outlived the link for a minute")
		}
	}
	h.SetLink(t, true)
	r := <-res
	if r.err != nil || r.o == nil || r.o.Status != "ok" {
		t.Fatalf("the cell across the drop: %+v %v\n%s", r.o, r.err, w.Diagnostics())
	}
	out := text(r.o)
	for i := range 30 {
		if strings.Count(out, fmt.Sprintf("tick %d\n", i)) != 1 {
			t.Fatalf("tick %d is not in the output exactly once:\n%s", i, out)
		}
	}
	if !strings.Contains(out, "done 41") {
		t.Fatalf("the cell across the drop did not finish in its generation:\n%s", out)
	}
	if o := run(t, w, "e3", "x + 1"); o.Status != "ok" || o.Value == nil || *o.Value != "42" {
		t.Fatalf("x after the link returned: %+v", o)
	}
	killChildren(t, "ControlPersist=no")
	if o := run(t, w, "e4", "x + 2"); o.Status != "ok" || o.Value == nil || *o.Value != "43" {
		t.Fatalf("x after the master was killed: %+v\n%s", o, w.Diagnostics())
	}
}

// TestRemoteWorkbenchGraceOver: a link that does not return within the
// host's down grace ends the generation on the host (its unit is gone), and
// when the host answers again the worker says it is dead and why: never a
// silent new generation under the old one's name.
func TestRemoteWorkbenchGraceOver(t *testing.T) {
	h, e := remoteLab(t)
	tg, _ := config.ParseSSHTarget(h.SSH())
	e2, err := hosts.New(hosts.Config{Hosts: map[string]hosts.Host{"lab": {Name: "lab", Target: tg, IdentityFile: h.IdentityFile,
		KnownHostsFile: h.KnownHostsFile, MaxJobs: 2, MemoryMaxBytes: 1 << 30, TasksMax: 256, CPUQuotaPct: 200,
		Wall: time.Hour, WorkDir: h.WorkDir, DownGrace: 2 * time.Second}}, ConnectTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e2.Close)
	e.Close()
	w, _ := startRemote(t, e2, 1)
	run(t, w, "e1", "x = 41")
	h.SetLink(t, false)
	t.Cleanup(func() { h.SetLink(t, true) })
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		units, err := h.Units("klbr-workbench-*")
		if err == nil && len(units) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the unit outlived its grace without a connection: %v %v", units, err)
		}
	}
	h.SetLink(t, true)
	select {
	case <-w.Dead():
	case <-time.After(45 * time.Second):
		t.Fatal("the worker did not learn that its generation ended")
	}
	if err := w.Err(); err == nil || !strings.Contains(err.Error(), "has ended") {
		t.Fatalf("the worker's end says %v", err)
	}
}

// BenchmarkRemoteRoundtrip: the round trip of the cell `x = 1` in a local
// workbench and in one on the lab host (over its SSH connection), side by
// side, for the goal remote ≤ local + 2 × link RTT; beside them what the
// remote one is made of: the resumable stream and the host's kernel on
// this machine (place=local-resume, and -relay through klbr-kernel
// --attach), the remote worker through the relay instead of the forward
// (place=remote-relay) and piped as before the resumable stream
// (place=remote-pipe), 64 bytes to `cat` in a unit of the host and back
// over the same connection (the SSH path alone, no klbr code), and the
// link's round trip (a TCP echo, and a UDP one, on the host).
func BenchmarkRemoteRoundtrip(b *testing.B) {
	h, e := remoteLab(b)
	ctx := context.Background()
	roundtrip := func(b *testing.B, w *Worker) {
		i := 0
		loopP50(b, func() {
			i++
			o, err := w.Execute(ctx, "b"+strconv.Itoa(i), "x = 1", nil)
			if err != nil || o.Status != "ok" {
				b.Fatalf("%+v %v", o, err)
			}
		})
	}
	b.Run("place=local", func(b *testing.B) {
		store, err := artifacts.New(filepath.Join(b.TempDir(), "artifacts"))
		if err != nil {
			b.Fatal(err)
		}
		w, err := Start(ctx, Spec{Role: RoleWorkbench, Session: "s1", Generation: 1, Kernel: env.Kernel, Python: env.Python,
			RuntimeSrc: env.Runtime, Workspace: b.TempDir(), Placer: env.Placer, Artifacts: store})
		if err != nil {
			b.Fatal(err)
		}
		defer w.Kill()
		roundtrip(b, w)
	})
	for _, direct := range []bool{true, false} {
		// The resumable stream and klbr-kernel --listen on this machine:
		// what the remote worker costs besides SSH and the link.
		name := "place=local-resume"
		if !direct {
			name += "-relay"
		}
		b.Run(name, func(b *testing.B) {
			store, err := artifacts.New(filepath.Join(b.TempDir(), "artifacts"))
			if err != nil {
				b.Fatal(err)
			}
			lr := &localResumable{dir: b.TempDir()}
			var r Remote = lr
			if direct {
				r = localDirect{lr}
			}
			w, err := Start(ctx, Spec{Role: RoleWorkbench, Session: "s1", Generation: 1, Kernel: env.Kernel, Python: "python3",
				RuntimeSrc: env.Runtime, Workspace: b.TempDir(), Artifacts: store, Remote: r})
			if err != nil {
				b.Fatal(err)
			}
			defer w.Kill()
			roundtrip(b, w)
		})
	}
	gen := int64(0)
	b.Run("place=remote", func(b *testing.B) {
		gen++
		w, _ := startRemote(b, e, gen)
		defer w.Kill()
		roundtrip(b, w)
	})
	b.Run("place=remote-relay", func(b *testing.B) {
		gen++
		w, _ := startRemoteAs(b, e, gen, func(u hosts.WorkerUnit) Remote { return relayUnit{u} })
		defer w.Kill()
		roundtrip(b, w)
	})
	b.Run("place=remote-pipe", func(b *testing.B) {
		gen++
		w, _ := startRemoteAs(b, e, gen, func(u hosts.WorkerUnit) Remote { return pipeUnit{u} })
		defer w.Kill()
		roundtrip(b, w)
	})
	b.Run("op=ssh-echo", func(b *testing.B) {
		// The SSH path alone: 64 bytes to `cat` in a unit of the host (its
		// stdin and stdout the session's, as the workbench's are) and back,
		// over the one connection: core → ssh master → TCP → sshd → pipe.
		cmd, err := e.Pipe(ctx, "lab", hosts.Unit{Name: "klbr-echo-1.service", Argv: []string{"cat"}})
		if err != nil {
			b.Fatal(err)
		}
		in, err := cmd.StdinPipe()
		if err != nil {
			b.Fatal(err)
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			b.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		defer func() { in.Close(); cmd.Wait() }()
		msg, buf := make([]byte, 64), make([]byte, 64)
		loopP50(b, func() {
			if _, err := in.Write(msg); err != nil {
				b.Fatal(err)
			}
			if _, err := io.ReadFull(out, buf); err != nil {
				b.Fatal(err)
			}
		})
	})
	b.Run("op=link-rtt-tcp", func(b *testing.B) {
		// A TCP echo on the host (Nagle off both ends): 64 bytes there and
		// back over the link, as the SSH connection's packets go. It listens
		// on a port of its own choosing and says which.
		echo := h.Enter("python3", "-c", `import socket, sys
s = socket.socket()
s.bind(("0.0.0.0", 0))
s.listen(1)
print(s.getsockname()[1], flush=True)
c, _ = s.accept()
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
while True:
    d = c.recv(64)
    if not d:
        break
    c.sendall(d)`)
		port, err := echo.StdoutPipe()
		if err != nil {
			b.Fatal(err)
		}
		if err := echo.Start(); err != nil {
			b.Fatal(err)
		}
		defer func() { echo.Process.Kill(); echo.Wait() }()
		line := make([]byte, 16)
		n, err := port.Read(line)
		if err != nil {
			b.Fatal(err)
		}
		c, err := net.Dial("tcp", net.JoinHostPort(h.Addr, strings.TrimSpace(string(line[:n]))))
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		msg, buf := make([]byte, 64), make([]byte, 64)
		loopP50(b, func() {
			if _, err := c.Write(msg); err != nil {
				b.Fatal(err)
			}
			if _, err := io.ReadFull(c, buf); err != nil {
				b.Fatal(err)
			}
		})
	})
	b.Run("op=link-rtt", func(b *testing.B) {
		// A UDP echo on the host: one datagram there and back over its link
		// (an upper bound of the link's round trip: it includes the echo's
		// own Python).
		echo := h.Enter("python3", "-c", `import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", 7777))
while True:
    d, a = s.recvfrom(64)
    s.sendto(d, a)`)
		if err := echo.Start(); err != nil {
			b.Fatal(err)
		}
		defer func() { echo.Process.Kill(); echo.Wait() }()
		c, err := net.Dial("udp", net.JoinHostPort(h.Addr, "7777"))
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		buf := make([]byte, 64)
		for i := 0; ; i++ { // until the echo listens
			c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
			c.Write([]byte("x"))
			if _, err := c.Read(buf); err == nil {
				break
			} else if i > 50 {
				b.Fatal("no echo from the host")
			}
		}
		c.SetReadDeadline(time.Time{})
		loopP50(b, func() {
			if _, err := c.Write([]byte("x")); err != nil {
				b.Fatal(err)
			}
			if _, err := c.Read(buf); err != nil {
				b.Fatal(err)
			}
		})
	})
}

// loopP50 runs f b.N times and reports the median of its durations beside
// the mean (ns/op): on a shared machine the median is the steadier figure.
func loopP50(b *testing.B, f func()) {
	var samples []float64
	for b.Loop() {
		t := time.Now()
		f()
		samples = append(samples, float64(time.Since(t).Nanoseconds())/1e3)
	}
	b.ReportMetric(median(samples), "p50-us")
}
