package worker

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/artifacts"
	"github.com/klbr-dev/klbr/internal/config"
	"github.com/klbr-dev/klbr/internal/hosts"
	"github.com/klbr-dev/klbr/internal/hosttest"
)

// remoteLab boots a worker host with this build's klbr-kernel on its PATH
// and returns an engine that knows it as "lab".
func remoteLab(t testing.TB) (*hosttest.Host, *hosts.Engine) {
	t.Helper()
	setup(t.(*testing.T))
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
		Remote: hosts.WorkerUnit{Engine: e, Host: "lab", Name: unit}, InterruptGrace: 500 * time.Millisecond})
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

	// A reset stops the remote unit; the next generation reuses the cached runtime.
	if units, err := h.Units("klbr-workbench-*"); err != nil || len(units) != 1 || units[0] != "klbr-workbench-s1-1.service" {
		t.Fatalf("units on the host while the worker runs: %v %v", units, err)
	}
	w.Kill()
	if units, err := h.Units("klbr-workbench-*"); err != nil || len(units) != 0 {
		t.Fatalf("units left on the host after the reset: %v %v", units, err)
	}
	w2, sent := startRemote(t, e, 2)
	if sent != 0 {
		t.Fatalf("the second start sent %d runtime bytes, want 0", sent)
	}
	if o := run(t, w2, "e4", "'x' in dir()"); o.Status != "ok" || o.Value == nil || *o.Value != "False" {
		t.Fatalf("a new generation kept the old heap: %+v", o)
	}
}
