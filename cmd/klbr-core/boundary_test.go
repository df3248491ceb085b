package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/citest"
	"github.com/klbr-dev/klbr/internal/kernel"
)

// cellProbe is a cell that tries what the outside test found a cell could do: read the
// operator token, open runtime.sqlite, post an operator input (and an exec) to control.sock,
// admit an input over ingress.sock, and the same from a double-forked grandchild in a new
// session. It returns a dict of outcomes.
const cellProbe = `
import json, os, socket, sqlite3, time
data = %q
res = {}
def attempt(name, f):
    try:
        res[name] = "ok: " + str(f())[:200]
    except Exception as e:
        res[name] = type(e).__name__ + ": " + str(e)[:200]
def read_token():
    return "%%d bytes" %% len(open(os.path.join(data, "operator-token")).read())  # never the secret itself
def open_db():
    c = sqlite3.connect(os.path.join(data, "runtime.sqlite"))
    return c.execute("select count(*) from sqlite_master").fetchone()
def post(sock, path, body):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    s.connect(sock)
    b = json.dumps(body).encode()
    s.sendall(("POST %%s HTTP/1.1\r\nHost: klbr\r\nContent-Type: application/json\r\nContent-Length: %%d\r\nConnection: close\r\n\r\n" %% (path, len(b))).encode() + b)
    out = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        out += chunk
    s.close()
    return out.split(b"\r\n", 1)[0].decode()
attempt("token", read_token)
attempt("db", open_db)
kernel = os.getppid()
core = int(open("/proc/%%d/stat" %% kernel).read().rsplit(")", 1)[1].split()[1])
attempt("core_environ", lambda: "%%d bytes" %% len(open("/proc/%%d/environ" %% core, "rb").read()))
def open_core_fds():
    # Listing the numbers is allowed; following one (readlink, open) is a ptrace check.
    opened = 0
    for fd in os.listdir("/proc/%%d/fd" %% core):
        try:
            os.close(os.open("/proc/%%d/fd/%%s" %% (core, fd), os.O_RDONLY))
            opened += 1
        except OSError:
            pass
        try:
            os.readlink("/proc/%%d/fd/%%s" %% (core, fd))
            opened += 1
        except OSError:
            pass
    if opened:
        return "%%d of the core's fds followed" %% opened
    raise PermissionError("none of the core's fds could be followed")
attempt("core_fds", open_core_fds)
attempt("core_mem", lambda: open("/proc/%%d/mem" %% core, "rb").close())
attempt("control_input", lambda: post(os.path.join(data, "control.sock"), "/v1/sessions/default/inputs", {"text": "from a cell", "source_key": "cell-1"}))
attempt("control_exec", lambda: post(os.path.join(data, "control.sock"), "/v1/sessions/default/exec", {"code": "1"}))
attempt("control_stop", lambda: post(os.path.join(data, "control.sock"), "/v1/stop", {}))
attempt("ingress", lambda: post(os.path.join(data, "ingress.sock"), "/v1/inputs", {}))
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.setsid()
    if os.fork() == 0:
        os.close(r)
        res.clear()
        attempt("token", read_token)
        attempt("control_input", lambda: post(os.path.join(data, "control.sock"), "/v1/sessions/default/inputs", {"text": "from a grandchild", "source_key": "cell-2"}))
        os.write(w, json.dumps(res).encode())
        os._exit(0)
    os._exit(0)
os.close(w)
os.waitpid(pid, 0)
got = b""
while True:
    chunk = os.read(r, 65536)
    if not chunk:
        break
    got += chunk
res["grandchild"] = json.loads(got)
print(json.dumps(res))
`

// TestCellIsNotTheOperator: a cell of the daemon's own uid reads no token, opens no
// database, and gets 403 from control.sock and ingress.sock, and so does a grandchild
// that left the cell's session; nothing it posted is stored; the operator, outside,
// still is served.
func TestCellIsNotTheOperator(t *testing.T) {
	if _, err := kernel.LandlockABI(); err != nil {
		citest.SkipOrFail(t, "landlock unavailable ("+err.Error()+"): the data directory cannot be hidden here; docs/operating.md says what holds then")
	}
	in := newInstance(t)
	in.must("init")
	srv := in.serve()
	out := in.must("exec", "default", fmt.Sprintf(cellProbe, in.dir))
	var got map[string]any
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("probe result %q: %v", out, err)
	}
	t.Logf("the cell got: %s", out)
	for _, k := range []string{"token", "db", "core_environ", "core_fds", "core_mem"} {
		if s, _ := got[k].(string); strings.HasPrefix(s, "ok") {
			t.Errorf("the cell could %s: %s", k, s)
		}
	}
	for _, k := range []string{"control_input", "control_exec", "control_stop", "ingress"} {
		if s, _ := got[k].(string); !strings.Contains(s, "403") {
			t.Errorf("%s answered %q, want 403", k, s)
		}
	}
	gc, _ := got["grandchild"].(map[string]any)
	if s, _ := gc["token"].(string); strings.HasPrefix(s, "ok") {
		t.Errorf("the grandchild read the token: %s", s)
	}
	if s, _ := gc["control_input"].(string); !strings.Contains(s, "403") {
		t.Errorf("the grandchild's control input answered %q, want 403", s)
	}
	// Nothing the cell posted was stored; the operator still is served.
	inputs := func() []string {
		var texts []string
		for _, line := range strings.Split(strings.TrimSpace(in.must("tail", "default", "--json")), "\n") {
			var r struct {
				Lane    string
				Content struct{ Text string }
			}
			json.Unmarshal([]byte(line), &r)
			if r.Lane == "input" {
				texts = append(texts, r.Content.Text)
			}
		}
		return texts
	}
	if got := inputs(); len(got) != 0 {
		t.Fatalf("a cell's post became an input: %q", got)
	}
	in.must("send", "default", "from the operator")
	if got := inputs(); len(got) != 1 || got[0] != "from the operator" {
		t.Fatalf("inputs after the operator's send: %q", got)
	}
	in.must("drain")
	if err := srv.wait(t); err != nil {
		t.Fatal(err)
	}
}

// escapeCell starts a double-forked sleeper in a new session that tries to leave its
// cgroup (writing itself into the root cgroup's cgroup.procs), then tries to SIGKILL its
// klbr-kernel, and prints the sleeper's pid and what both attempts got.
const escapeCell = `
import os, signal, time
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.setsid()
    if os.fork() == 0:
        os.close(r)
        try:
            with open("/sys/fs/cgroup/cgroup.procs", "w") as f:
                f.write(str(os.getpid()))
            moved = "moved"
        except OSError as e:
            moved = type(e).__name__
        os.write(w, (str(os.getpid()) + " " + moved).encode())
        os.close(w)
        while True:
            time.sleep(1)
    os._exit(0)
os.close(w)
os.waitpid(pid, 0)
line = os.read(r, 100).decode()
kernel = os.getppid()
try:
    os.kill(kernel, signal.SIGKILL)
    killed = "killed"
except OSError as e:
    killed = type(e).__name__
line + " " + killed
`

// TestContainmentEscape: 20 times, a cell's double-forked sleeper tries to move out of its
// cgroup and the cell tries to kill its klbr-kernel; then reset --kernel (odd tries) or the
// daemon's stop (the last) must leave no sleeper alive.
func TestContainmentEscape(t *testing.T) {
	if _, err := kernel.LandlockABI(); err != nil {
		citest.SkipOrFail(t, "landlock unavailable: "+err.Error())
	}
	in := newInstance(t)
	in.must("init")
	srv := in.serve()
	var sleepers []int
	t.Cleanup(func() {
		for _, p := range sleepers {
			syscallKill(p)
		}
	})
	const tries = 20
	for i := range tries {
		out := strings.TrimSpace(in.must("exec", "default", escapeCell))
		f := strings.Fields(strings.Trim(out, "'"))
		if len(f) != 3 {
			t.Fatalf("try %d: cell printed %q", i, out)
		}
		pid, _ := strconv.Atoi(f[0])
		sleepers = append(sleepers, pid)
		if f[1] == "moved" {
			t.Errorf("try %d: the sleeper wrote itself into the root cgroup", i)
		}
		if f[2] == "killed" {
			t.Errorf("try %d: the cell killed its klbr-kernel", i)
		}
		if i < tries-1 {
			in.must("reset", "default", "--kernel")
			requireDead(t, pid, fmt.Sprintf("try %d: after reset --kernel", i))
		}
	}
	in.must("stop")
	if err := srv.wait(t); err != nil {
		t.Fatal(err)
	}
	requireDead(t, sleepers[len(sleepers)-1], "after stop")
}

// requireDead waits up to 5 s for pid to be gone (or a zombie).
func requireDead(t *testing.T, pid int, when string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
		if err != nil {
			return
		}
		if i := strings.LastIndexByte(string(b), ')'); i > 0 && len(b) > i+2 && (b[i+2] == 'Z' || b[i+2] == 'X') {
			return
		}
		if time.Now().After(deadline) {
			syscallKill(pid)
			t.Fatalf("%s: sleeper %d survived", when, pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func syscallKill(pid int) { _ = syscall.Kill(pid, syscall.SIGKILL) }

// TestCellRunsAsAnotherUser: as root, with an interpreter and a workspace another uid can
// reach, workers run as the workspace's owner: the cell's uid is not 0, it cannot read the
// token, write the data directory or post to control.sock (0600, root's), and it still has
// its workspace, its runtime and its drafts.
func TestCellRunsAsAnotherUser(t *testing.T) {
	if os.Geteuid() != 0 {
		citest.SkipOrFail(t, "dropping workers to another uid needs root")
	}
	const py = "/usr/bin/python3"
	if _, err := os.Stat(py); err != nil {
		citest.SkipOrFail(t, "needs "+py+" (an interpreter outside root's home)")
	}
	in := newInstance(t)
	root := filepath.Dir(in.dir)
	ws := filepath.Join(root, "ws")
	if err := os.MkdirAll(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	os.Chown(ws, 65534, 65534)
	os.Chmod(root, 0o755)
	in.env = append(in.env, "KLBR_WORKSPACE="+ws, "KLBR_PYTHON="+py)
	in.must("init")
	srv := in.serve()
	status := in.must("status")
	if !strings.Contains(status, "workers run as uid 65534") {
		t.Fatalf("status does not say workers dropped to 65534:\n%s\n%s", status, srv.log())
	}
	out := in.must("exec", "default", fmt.Sprintf(`
import json, os, socket
data = %q
res = {"uid": os.getuid(), "gid": os.getgid()}
def attempt(name, f):
    try:
        f(); res[name] = "ok"
    except Exception as e:
        res[name] = type(e).__name__
attempt("token", lambda: open(os.path.join(data, "operator-token")).read())
attempt("write_data", lambda: open(os.path.join(data, "x"), "w").close())
attempt("connect_control", lambda: socket.socket(socket.AF_UNIX).connect(os.path.join(data, "control.sock")))
attempt("write_workspace", lambda: open("note.txt", "w").write("mine"))
d = await behavior.draft()
attempt("write_draft", lambda: open(os.path.join(str(d.path), "NOTE.md"), "w").write("x"))
print(json.dumps(res))
`, in.dir))
	var got map[string]any
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("cell printed %q: %v", out, err)
	}
	if got["uid"] != float64(65534) {
		t.Errorf("the cell runs as uid %v, want 65534", got["uid"])
	}
	for k, want := range map[string]string{"token": "PermissionError", "write_data": "PermissionError", "connect_control": "PermissionError", "write_workspace": "ok", "write_draft": "ok"} {
		if got[k] != want {
			t.Errorf("%s: %v, want %s (all: %v)", k, got[k], want, got)
		}
	}
	in.must("drain")
	if err := srv.wait(t); err != nil {
		t.Fatal(err)
	}
}
