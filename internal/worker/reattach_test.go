package worker

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/config"
	"github.com/klbr-dev/klbr/internal/hosts"
	"github.com/klbr-dev/klbr/internal/hosttest"
)

// labEngine is a second engine to the lab host: a restarted klbr-core's.
func labEngine(t *testing.T, h *hosttest.Host) *hosts.Engine {
	t.Helper()
	tg, _ := config.ParseSSHTarget(h.SSH())
	e, err := hosts.New(hosts.Config{Hosts: map[string]hosts.Host{"lab": {Name: "lab", Target: tg, IdentityFile: h.IdentityFile,
		KnownHostsFile: h.KnownHostsFile, MaxJobs: 2, MemoryMaxBytes: 1 << 30, TasksMax: 256, CPUQuotaPct: 200,
		Wall: time.Hour, WorkDir: h.WorkDir}}, ConnectTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return e
}

// TestReattachAfterTheCoreDied: the klbr-core that started a generation on
// the host dies (its connections with it) while a cell of it runs; a new
// one reattaches the generation (Reattach: nothing started): its hello is
// checked, the cut cell is interrupted on the host, and the next cell sees
// the variables of before. A generation whose unit is not there, or a
// worker that is not the generation asked for, is never attached.
func TestReattachAfterTheCoreDied(t *testing.T) {
	h, e := remoteLab(t)
	w, _ := startRemote(t, e, 1)
	run(t, w, "e1", "x = 41")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	go w.Execute(ctx, "e2", "import time\nprint('sleeping', flush=True)\ntime.sleep(600)", nil)
	time.Sleep(time.Second)
	e.Close() // the old klbr-core is gone: its connection, and every one it would make

	e2 := labEngine(t, h)
	spec := func(gen int64, unit string) Spec {
		return Spec{Role: RoleWorkbench, Session: "s1", Generation: gen, Kernel: "klbr-kernel", Python: "python3",
			Remote: hosts.WorkerUnit{Engine: e2, Host: "lab", Name: unit}, InterruptGrace: 500 * time.Millisecond}
	}
	began := time.Now()
	if _, err := Reattach(ctx, spec(2, hosts.WorkerUnitName(RoleWorkbench, "s1", 2))); err == nil {
		t.Fatal("a generation with no unit was reattached")
	} else if d := time.Since(began); d > 20*time.Second {
		t.Fatalf("a generation with no unit took %s to refuse: %v", d, err)
	}
	w2, err := Reattach(ctx, spec(1, hosts.WorkerUnitName(RoleWorkbench, "s1", 1)))
	if err != nil {
		t.Fatalf("Reattach: %v", err)
	}
	defer w2.Kill()
	if w2.Hello().PID != w.Hello().PID {
		t.Fatalf("the reattached worker is pid %d, the generation's was %d", w2.Hello().PID, w.Hello().PID)
	}
	if o := run(t, w2, "e3", "x + 1"); o.Status != "ok" || o.Value == nil || *o.Value != "42" {
		t.Fatalf("x after the reattach: %+v\n%s", o, w2.Diagnostics())
	}
	if units, err := h.Units("klbr-workbench-*"); err != nil || strings.Join(units, " ") != "klbr-workbench-s1-1.service" {
		t.Fatalf("units on the host: %v %v", units, err)
	}
	w2.Kill()

	// A worker that is not the generation asked for (its unit's name lied)
	// is never attached: it refuses the reattach frame, which names
	// another generation, and ends; its unit is stopped.
	w3, _ := startRemote(t, e2, 3)
	run(t, w3, "e1", "y = 1")
	e2.Close()
	e3 := labEngine(t, h)
	s := spec(4, hosts.WorkerUnitName(RoleWorkbench, "s1", 3))
	s.Remote = hosts.WorkerUnit{Engine: e3, Host: "lab", Name: hosts.WorkerUnitName(RoleWorkbench, "s1", 3)}
	if w4, err := Reattach(ctx, s); err == nil {
		t.Fatalf("a worker of another generation was attached: %+v", w4.Hello())
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		units, err := h.Units("klbr-workbench-*")
		if err == nil && len(units) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("units on the host after a refused reattach: %v %v", units, err)
		}
	}
}
