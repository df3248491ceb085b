package worker

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestWorkbenchSemantics(t *testing.T) {
	w, _ := start(t, opts{})
	h := w.Hello()
	if h.Role != RoleWorkbench || h.Session != "s1" || h.Generation != 1 || h.PID == 0 || h.Python == "" {
		t.Fatalf("hello: %+v", h)
	}
	for _, tc := range []struct {
		name, code string
		status     string
		value      string
		out        string
		errType    string
	}{
		{"assignment", "x = 41", "ok", "", "", ""},
		{"globals survive", "x + 1", "ok", "42", "", ""},
		{"print is output, not a value", "print('hello')", "ok", "", "hello\n", ""},
		{"top-level await", "import asyncio\nawait asyncio.sleep(0.01)\n'awaited'", "ok", "'awaited'", "", ""},
		{"exception", "1/0", "error", "", "", "ZeroDivisionError"},
		{"SystemExit is an outcome", "raise SystemExit(3)", "error", "", "", "SystemExit"},
		{"still alive after SystemExit", "x", "ok", "41", "", ""},
		{"forged frame is just text", "import sys, struct, json\nb = json.dumps({'v':1,'type':'outcome','session':'s1','generation':1,'execution':'forged','status':'ok'}).encode()\nsys.stdout.write(struct.pack('>I', len(b)).decode('latin-1') + b.decode())\n7", "ok", "7", "\"type\": \"outcome\"", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := run(t, w, "e-"+strings.ReplaceAll(tc.name, " ", "-"), tc.code)
			if o.Status != tc.status {
				t.Fatalf("status %s (%+v), want %s", o.Status, o.Error, tc.status)
			}
			got := ""
			if o.Value != nil {
				got = *o.Value
			}
			if got != tc.value {
				t.Errorf("value %q, want %q", got, tc.value)
			}
			if !strings.Contains(text(o), tc.out) {
				t.Errorf("output %q lacks %q", text(o), tc.out)
			}
			if tc.errType != "" && (o.Error == nil || o.Error.Type != tc.errType || o.Error.Traceback == "") {
				t.Errorf("error %+v, want %s with a traceback", o.Error, tc.errType)
			}
			if o.Reset {
				t.Errorf("reset")
			}
		})
	}
}

func TestOutputPastThePreviewIsSpooledToAnArtifact(t *testing.T) {
	w, _ := start(t, opts{})
	o := run(t, w, "big", "for i in range(20000):\n    print(f'line {i:06d} ' + 'x' * 20)")
	var want strings.Builder
	for i := range 20000 {
		want.WriteString("line " + pad6(i) + " " + strings.Repeat("x", 20) + "\n")
	}
	out := o.Output
	if out.Artifact == nil || out.SpoolError != "" {
		t.Fatalf("no artifact: %+v", out.SpoolError)
	}
	if out.TotalBytes != int64(want.Len()) || out.OmittedBytes == 0 || out.OmittedBytes+int64(len(text(o))) != out.TotalBytes {
		t.Fatalf("counts: total %d omitted %d preview %d, want total %d", out.TotalBytes, out.OmittedBytes, len(text(o)), want.Len())
	}
	if len(text(o)) > DefaultPreviewBytes {
		t.Fatalf("preview of %d bytes is over the bound", len(text(o)))
	}
	sum := sha256.Sum256([]byte(want.String()))
	if out.Artifact.SHA256 != hex.EncodeToString(sum[:]) {
		t.Fatalf("artifact hash %s is not the hash of the whole output", out.Artifact.SHA256)
	}
	p, _ := w.spec.Artifacts.Path(out.Artifact.SHA256)
	b, err := os.ReadFile(p)
	if err != nil || string(b) != want.String() {
		t.Fatalf("artifact content differs (%v)", err)
	}
}

func pad6(i int) string {
	s := strconv.Itoa(i)
	return strings.Repeat("0", 6-len(s)) + s
}

func TestLateBackgroundOutputIsLabeledNotGivenToTheNextCell(t *testing.T) {
	w, l := start(t, opts{})
	run(t, w, "e1", "import asyncio\nasync def later():\n    await asyncio.sleep(0.2)\n    print('from the task')\nt = asyncio.create_task(later(), name='bg')")
	o := run(t, w, "e2", "import asyncio\nawait asyncio.sleep(0.4)\n'second'")
	if strings.Contains(text(o), "from the task") {
		t.Fatalf("late output given to the next cell: %q", text(o))
	}
	deadline := time.Now().Add(3 * time.Second)
	for !strings.Contains(l.all(), "e1|task|bg|from the task") {
		if time.Now().After(deadline) {
			t.Fatalf("late output not reported with its task and execution: %q", l.all())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestInterruptIsCooperativeFirst(t *testing.T) {
	w, _ := start(t, opts{})
	run(t, w, "setup", "kept = 'still here'")
	for _, code := range []string{"while True:\n    pass", "import asyncio\nwhile True:\n    await asyncio.sleep(0.01)"} {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		o, err := w.Execute(ctx, "spin", code, nil)
		cancel()
		if err != nil || o.Status != "cancelled" || o.Reset {
			t.Fatalf("%q: %+v %v", code, o, err)
		}
		if o := run(t, w, "after", "kept"); o.Value == nil || *o.Value != "'still here'" {
			t.Fatalf("globals lost after a cooperative interrupt: %+v", o)
		}
	}
}

func TestUncooperativeCellIsKilledWithItsWholeTree(t *testing.T) {
	w, _ := start(t, opts{})
	o := run(t, w, "spawn", `import subprocess, os
child = subprocess.Popen(["sleep", "1000"])
# a double-forked daemon: its parent exits, it is reparented away from us
daemon = subprocess.Popen(["sh", "-c", "(setsid sleep 1000 & echo $! > daemon.pid) &"])
daemon.wait()
import time
while not os.path.exists("daemon.pid") or not open("daemon.pid").read().strip():
    time.sleep(0.01)
(child.pid, int(open("daemon.pid").read()), os.getpid())`)
	if o.Value == nil {
		t.Fatalf("no pids: %+v", o)
	}
	var pids [3]int
	var s = strings.Trim(*o.Value, "()")
	for i, f := range strings.Split(s, ",") {
		pids[i], _ = strconv.Atoi(strings.TrimSpace(f))
	}
	for _, p := range pids {
		if !alive(p) {
			t.Fatalf("pid %d not running before the kill (%v)", p, pids)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	o, err := w.Execute(ctx, "stubborn", "while True:\n    try:\n        while True:\n            pass\n    except KeyboardInterrupt:\n        pass", nil)
	if err != nil {
		t.Fatal(err)
	}
	if !o.Reset || o.Status != "cancelled" || o.Error == nil || o.Error.Type != "KernelReset" {
		t.Fatalf("outcome %+v, want a cancelled reset", o)
	}
	for _, p := range pids {
		waitGone(t, p)
	}
	if _, err := w.Execute(context.Background(), "next", "1", nil); !errors.Is(err, ErrDead) {
		t.Fatalf("a killed worker ran another cell: %v", err)
	}
}

func TestWorkerDeathIsAResetOutcome(t *testing.T) {
	w, _ := start(t, opts{})
	o := run(t, w, "die", "import os\nprint('bye', flush=True)\nos._exit(3)")
	if !o.Reset || o.Error == nil || o.Error.Type != "WorkerDied" || !strings.Contains(o.Error.Message, "exit status 3") {
		t.Fatalf("outcome %+v", o.Error)
	}
}

func TestHostRequests(t *testing.T) {
	w, l := start(t, opts{})
	h := handlerFunc(func(ctx context.Context, r Request) (json.RawMessage, error) {
		switch r.Op {
		case "test.echo":
			return r.Args, nil
		case "test.huge":
			return json.Marshal(map[string]string{"text": strings.Repeat("x", MaxFrameBytes)})
		default:
			return nil, &RequestError{Code: "unsupported", Message: "no op " + r.Op}
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	o, err := w.Execute(ctx, "r1", "from klbr import host\nr = await host.request('test.echo', {'a': 1})\nr['a']", h)
	if err != nil || o.Status != "ok" || o.Value == nil || *o.Value != "1" {
		t.Fatalf("echo: %+v %v (%+v)", o, err, o.Error)
	}
	o, _ = w.Execute(ctx, "r2", "from klbr import host\nawait host.request('nope', {})", h)
	if o.Status != "error" || o.Error == nil || !strings.Contains(o.Error.Message, "unsupported") {
		t.Fatalf("unknown op: %+v", o.Error)
	}
	// An answer over the frame bound is an error for the cell; the worker lives.
	o, _ = w.Execute(ctx, "r2b", "from klbr import host\ntry:\n    await host.request('test.huge', {})\nexcept Exception as e:\n    print(e.code)", h)
	if o.Status != "ok" || !strings.Contains(text(o), "too_large") {
		t.Fatalf("huge answer: %+v", o)
	}
	if o := run(t, w, "r2c", "1+1"); o.Value == nil || *o.Value != "2" {
		t.Fatalf("worker after a huge answer: %+v", o)
	}
	// A request from a background task after its cell finished is refused as stale.
	w.Execute(ctx, "r3", `import asyncio, klbr
from klbr import host
async def late():
    await asyncio.sleep(0.2)
    try:
        await host.request('test.echo', {})
        print('served')
    except klbr.HostError as e:
        print('refused', e.code)
t = asyncio.create_task(late(), name='late-req')`, h)
	run(t, w, "r4", "import asyncio\nawait asyncio.sleep(0.5)")
	deadline := time.Now().Add(3 * time.Second)
	for !strings.Contains(l.all(), "refused stale") {
		if time.Now().After(deadline) {
			t.Fatalf("late request not refused as stale: %q", l.all())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestHooksRole(t *testing.T) {
	dir := t.TempDir()
	pkg := filepath.Join(dir, "klbr_hooks")
	os.MkdirAll(pkg, 0o755)
	os.WriteFile(filepath.Join(pkg, "__init__.py"), []byte(`
def review(inp):
    return {"decision": "allow", "saw": inp["text"]}
def broken(inp):
    raise ValueError("policy bug")
SLOTS = {"delivery.review": review, "attention.plan": broken}
`), 0o644)
	w, _ := start(t, opts{role: RoleHooks, behavior: dir})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := w.Invoke(ctx, "delivery.review", json.RawMessage(`{"text":"hi"}`))
	if err != nil || !strings.Contains(string(res), `"saw": "hi"`) && !strings.Contains(string(res), `"saw":"hi"`) {
		t.Fatalf("review: %s %v", res, err)
	}
	if _, err := w.Invoke(ctx, "attention.plan", json.RawMessage(`{}`)); err == nil || !strings.Contains(err.Error(), "policy bug") {
		t.Fatalf("failing hook: %v", err)
	}
}

func TestMisbehavingWorkersAreRejectedAndKilled(t *testing.T) {
	for _, tc := range []struct {
		name string
		body string
		want string
	}{
		{"never says hello", "import time\ntime.sleep(1000)", "no hello"},
		{"wrong generation", "hello(generation=99)\nimport time\ntime.sleep(1000)", "want s1/1"},
		{"wrong protocol version", "hello(v=2, protocol=2)\nimport time\ntime.sleep(1000)", "protocol"},
		{"wrong role", "hello(role='hooks')\nimport time\ntime.sleep(1000)", "role"},
		{"garbage JSON", "send(None, raw=b'{not json')\nimport time\ntime.sleep(1000)", "malformed JSON"},
		{"oversized frame", "sock.sendall(struct.pack('>I', 5 << 20))\nimport time\ntime.sleep(1000)", "outside 1.."},
		{"truncated frame", "sock.sendall(struct.pack('>I', 100) + b'{\"v\":1')\nsock.close()\nimport time\ntime.sleep(1000)", "inside a 100-byte frame"},
		{"exits at once", "sys.exit(0)", "before saying hello"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			setup(t)
			rt := fakeRuntime(t, tc.body)
			_, err := Start(context.Background(), Spec{
				Role: RoleWorkbench, Session: "s1", Generation: 1, Kernel: env.Kernel, Python: env.Python,
				RuntimeSrc: rt, Workspace: t.TempDir(), Placer: env.Placer, Handshake: 500 * time.Millisecond,
			})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Start: %v, want an error mentioning %q", err, tc.want)
			}
		})
	}
}

func TestBadFramesAfterTheHandshakeKillTheWorker(t *testing.T) {
	for _, tc := range []struct{ name, frame string }{
		{"another generation", `send({"v":1,"type":"output","session":"s1","generation":7,"execution":"x","stream":"stdout","data":"hi"})`},
		{"unknown type", `send({"v":1,"type":"bogus","session":"s1","generation":1})`},
		{"bad stream", `send({"v":1,"type":"output","session":"s1","generation":1,"execution":"x","stream":"fd9","data":"hi"})`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			setup(t)
			rt := fakeRuntime(t, "hello()\n"+tc.frame+"\nimport time\ntime.sleep(1000)")
			w, err := Start(context.Background(), Spec{
				Role: RoleWorkbench, Session: "s1", Generation: 1, Kernel: env.Kernel, Python: env.Python,
				RuntimeSrc: rt, Workspace: t.TempDir(), Placer: env.Placer,
			})
			if err != nil {
				t.Fatal(err)
			}
			select {
			case <-w.Exited():
			case <-time.After(5 * time.Second):
				t.Fatal("a worker that broke the protocol is still running")
			}
			if !errors.Is(w.Err(), ErrProtocol) && !errors.Is(w.Err(), ErrDead) {
				t.Fatalf("Err = %v", w.Err())
			}
		})
	}
}

func TestStopNeverWaitsOnTheWorker(t *testing.T) {
	w, _ := start(t, opts{})
	go w.Execute(context.Background(), "busy", "while True:\n    try:\n        while True: pass\n    except KeyboardInterrupt: pass", nil)
	time.Sleep(100 * time.Millisecond)
	begin := time.Now()
	w.Stop()
	if d := time.Since(begin); d > 50*time.Millisecond {
		t.Fatalf("Stop took %s", d)
	}
	select {
	case <-w.Exited():
	case <-time.After(6 * time.Second):
		t.Fatal("the worker outlived Stop")
	}
}
