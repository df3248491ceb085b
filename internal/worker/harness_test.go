package worker

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/artifacts"
	"github.com/klbr-dev/klbr/internal/placement"
	"github.com/klbr-dev/klbr/internal/workertest"
)

// env is the shared worker environment (workertest), set by setup.
var env workertest.Env

func setup(t *testing.T) {
	t.Helper()
	env = workertest.Setup(t)
}

type late struct {
	mu     sync.Mutex
	chunks []string
}

func (l *late) add(exec string, ch OutputChunk) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.chunks = append(l.chunks, fmt.Sprintf("%s|%s|%s|%s", exec, ch.Origin, ch.Task, ch.Data))
}

func (l *late) all() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.chunks, "\n")
}

type opts struct {
	role      string
	runtime   string // a fake runtime src dir
	behavior  string
	handshake time.Duration
	limits    placement.Limits
}

func start(t *testing.T, o opts) (*Worker, *late) {
	t.Helper()
	setup(t)
	if o.role == "" {
		o.role = RoleWorkbench
	}
	if o.runtime == "" {
		o.runtime = env.Runtime
	}
	store, err := artifacts.New(filepath.Join(t.TempDir(), "artifacts"))
	if err != nil {
		t.Fatal(err)
	}
	l := &late{}
	w, err := Start(context.Background(), Spec{
		Role: o.role, Session: "s1", Generation: 1,
		Kernel: env.Kernel, Python: env.Python, RuntimeSrc: o.runtime, Workspace: t.TempDir(), Behavior: o.behavior,
		Placer: env.Placer, Limits: o.limits, Artifacts: store, Handshake: o.handshake,
		InterruptGrace: 500 * time.Millisecond, LateOutput: l.add,
	})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(w.Kill)
	return w, l
}

func run(t *testing.T, w *Worker, id, code string) *Outcome {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	o, err := w.Execute(ctx, id, code, nil)
	if err != nil {
		t.Fatalf("Execute %s: %v", id, err)
	}
	return o
}

func text(o *Outcome) string {
	var b strings.Builder
	for _, c := range o.Output.Preview {
		b.WriteString(c.Data)
	}
	return b.String()
}

// alive reports whether pid is a live (non-zombie) process.
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

func waitGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for alive(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("process %d is still alive", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

type handlerFunc func(context.Context, Request) (json.RawMessage, error)

func (f handlerFunc) HandleRequest(ctx context.Context, r Request) (json.RawMessage, error) {
	return f(ctx, r)
}

// fakeRuntime writes a klbr_runtime package whose __main__ is body, so a
// test can play a misbehaving worker through the real kernel.
func fakeRuntime(t *testing.T, body string) string {
	t.Helper()
	dir := t.TempDir()
	pkg := filepath.Join(dir, "klbr_runtime")
	os.MkdirAll(pkg, 0o755)
	os.WriteFile(filepath.Join(pkg, "__init__.py"), nil, 0o644)
	prelude := `import os, sys, json, struct, socket
sock = socket.socket(fileno=int(os.environ["KLBR_PROTOCOL_FD"]))
def send(obj, raw=None):
    b = raw if raw is not None else json.dumps(obj).encode()
    sock.sendall(struct.pack(">I", len(b)) + b)
def hello(**kw):
    f = {"v": 1, "type": "hello", "session": os.environ["KLBR_SESSION"], "generation": int(os.environ["KLBR_GENERATION"]),
         "role": os.environ["KLBR_ROLE"], "pid": os.getpid(), "python": "3", "sdk": "0", "protocol": 1}
    f.update(kw)
    send(f)
`
	os.WriteFile(filepath.Join(pkg, "__main__.py"), []byte(prelude+body), 0o644)
	return dir
}
