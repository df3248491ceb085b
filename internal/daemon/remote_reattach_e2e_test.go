package daemon

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/hosttest"
	"github.com/klbr-dev/klbr/internal/modeltest"
	"github.com/klbr-dev/klbr/internal/store"
)

// reattachLab is a host with the test build's klbr-kernel and the TOML of
// its [hosts.lab] (a down grace long enough to outlast a restart).
func reattachLab(t *testing.T) (*hosttest.Host, string) {
	t.Helper()
	h := hosttest.Start(t)
	b, err := os.ReadFile(filepath.Join(kernelDir(t), "klbr-kernel"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(h.BinDir, "klbr-kernel"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	return h, fmt.Sprintf("[hosts.lab]\nssh = %q\nidentity_file = %q\nknown_hosts_file = %q\nwork_dir = %q\nmanager = %q\ndown_grace_seconds = 120\n",
		h.SSH(), h.IdentityFile, h.KnownHostsFile, h.WorkDir, h.Manager)
}

// waitUnits waits until the host's units matching pattern are exactly want.
func waitUnits(t *testing.T, a *agent, h *hosttest.Host, pattern string, want ...string) {
	t.Helper()
	var units []string
	var err error
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		units, err = h.Units(pattern)
		if err == nil && strings.Join(units, " ") == strings.Join(want, " ") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("units %s on the host: %v %v; want %v\n%s", pattern, units, err, want, a.d)
		}
	}
}

// klbr-core is SIGKILLed while the root's workbench on the host holds x =
// 41 and restarts: the restarted klbr-core reattaches the same generation
// (never a second unit), and the next cell sees x + 1 == 42. A cell that
// was running at the kill is recorded as every cell cut by a restart is
// (lost, not replayed), and the worker drops it: the cell after the
// restart runs.
func TestRemoteWorkbenchReattachedAfterKill(t *testing.T) {
	h, hostTOML := reattachLab(t)
	model := modeltest.New()
	defer model.Close()
	model.Then(
		modeltest.Reply{Calls: []modeltest.Call{{ID: "c1", Code: "x = 41\nprint('set')"}}},
		modeltest.Reply{Calls: []modeltest.Call{{ID: "c2", Code: "await runtime.wait(None)"}}},
		modeltest.Reply{Calls: []modeltest.Call{{ID: "c3", Code: "print('x + 1 is', x + 1)"}}},
		modeltest.Reply{Calls: []modeltest.Call{{ID: "c4", Code: "import time\ntime.sleep(600)"}}},
		modeltest.Reply{Calls: []modeltest.Call{{ID: "c5", Code: "print('then x + 1 is', x + 1)"}}},
		modeltest.Reply{Calls: []modeltest.Call{{ID: "c6", Code: "await runtime.wait(None)"}}},
	)
	a := startAgentTOML(t, "", route("main", model, "")+hostTOML, "KLBR_REMOTE_PLACEMENT=lab")
	a.send("first")
	a.eventually("the session waits", func() bool { return model.Count() == 2 && a.session().State == store.StateWaiting })
	if !a.cellSaid("default", "set") {
		t.Fatalf("the first cell did not run\n%s", a.dump())
	}
	a.kill()
	a.start()
	a.send("second")
	// (The cell's code says "is', x + 1": only its output says "is 42".)
	a.eventually("the cell after the restart sees x = 41", func() bool { return a.cellSaid("default", "x + 1 is 42") })
	waitUnits(t, a, h, "klbr-workbench-*", "klbr-workbench-default-1.service")
	// Killed again while the next cell sleeps: it is lost, not replayed,
	// and the worker is reattached with its variables.
	a.eventually("the sleeping cell runs", func() bool { return model.Count() == 4 && len(a.kinds(store.LaneCell, "cell.started")) == 4 })
	time.Sleep(time.Second)
	a.kill()
	a.start()
	a.eventually("the turn after the second restart waits", func() bool {
		return model.Count() == 6 && a.session().State == store.StateWaiting
	})
	if !a.cellSaid("default", "then x + 1 is 42") {
		t.Fatalf("the cell after the second restart did not see x = 41\n%s\n%s", a.dump(), a.d)
	}
	var lost int
	for _, r := range a.kinds(store.LaneCell, "cell.finished") {
		if strings.Contains(string(r.Content), `"lost"`) {
			lost++
		}
	}
	if lost != 1 {
		t.Fatalf("%d cells lost; want the one cut by the kill\n%s", lost, a.dump())
	}
	if resets := a.kinds(store.LaneNotice, "kernel.reset"); len(resets) != 0 {
		t.Fatalf("kernel.reset notices after reattaching: %v", resets)
	}
	if started := a.kinds(store.LaneNotice, "kernel.started"); len(started) != 1 {
		t.Fatalf("kernel.started notices: %d; want one generation", len(started))
	}
	waitUnits(t, a, h, "klbr-workbench-*", "klbr-workbench-default-1.service")
}

// A generation the store says ended (a reset recorded, its unit not yet
// stopped when klbr-core died) is not reattached after a restart: its unit
// is stopped, and the next cell runs in a new generation.
func TestRemoteWorkbenchEndedGenerationStoppedAfterRestart(t *testing.T) {
	h, hostTOML := reattachLab(t)
	model := modeltest.New()
	defer model.Close()
	model.Then(
		modeltest.Reply{Calls: []modeltest.Call{{ID: "c1", Code: "x = 41\nprint('set')"}}},
		modeltest.Reply{Calls: []modeltest.Call{{ID: "c2", Code: "await runtime.wait(None)"}}},
		modeltest.Reply{Calls: []modeltest.Call{{ID: "c3", Code: "print('x is', globals().get('x'))"}}},
		modeltest.Reply{Calls: []modeltest.Call{{ID: "c4", Code: "await runtime.wait(None)"}}},
	)
	a := startAgentTOML(t, "", route("main", model, "")+hostTOML, "KLBR_REMOTE_PLACEMENT=lab")
	a.send("first")
	a.eventually("the session waits", func() bool { return model.Count() == 2 && a.session().State == store.StateWaiting })
	a.kill()
	st, err := store.Open(t.Context(), a.data, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Write(t.Context(), func(tx *store.Tx) error {
		return tx.KernelReset("default", 1, "test: ended before its unit was stopped")
	}); err != nil {
		t.Fatal(err)
	}
	st.Close()
	waitUnits(t, a, h, "klbr-workbench-*", "klbr-workbench-default-1.service")
	a.start()
	waitUnits(t, a, h, "klbr-workbench-*")
	a.send("second")
	a.eventually("the second turn waits", func() bool { return model.Count() == 4 && a.session().State == store.StateWaiting })
	if !a.cellSaid("default", "x is None") {
		t.Fatalf("the cell after the restart ran in the ended generation\n%s\n%s", a.dump(), a.d)
	}
	waitUnits(t, a, h, "klbr-workbench-*", "klbr-workbench-default-2.service")
}

// A child working on the host holds x = 41 when klbr-core is SIGKILLed;
// after the restart its workbench is reattached, not restarted: its next
// cell sees x + 1 == 42, and the host has one unit of it.
func TestRemoteChildWorkbenchReattachedAfterKill(t *testing.T) {
	h, ws := remoteChildLab(t)
	model := modeltest.New()
	defer model.Close()
	var mu sync.Mutex
	rootN, childN := 0, 0
	model.Answer(func(n int, req modeltest.Request) modeltest.Reply {
		mu.Lock()
		defer mu.Unlock()
		for _, m := range req.Messages {
			if strings.Contains(content(m), "TASK-ON-HOST") && m["role"] == "user" {
				childN++
				switch childN {
				case 1:
					return modeltest.Reply{Calls: []modeltest.Call{{ID: "k1", Code: "x = 41\nprint('CHILD SET')"}}}
				case 2:
					return modeltest.Reply{Calls: []modeltest.Call{{ID: "k2", Code: "await runtime.wait(15, reason='later')"}}}
				case 3:
					return modeltest.Reply{Calls: []modeltest.Call{{ID: "k3", Code: "print('CHILD-X-IS', x + 1)"}}}
				}
				return modeltest.Reply{Calls: []modeltest.Call{{ID: fmt.Sprintf("k%d", n), Code: "await runtime.wait(None, reason='done')"}}}
			}
		}
		rootN++
		if rootN == 1 {
			return modeltest.Reply{Calls: []modeltest.Call{{ID: "r1", Code: "await agents.spawn(task='TASK-ON-HOST: hold x', host='lab')\n" +
				"await runtime.wait(None, reason='the child works')"}}}
		}
		return modeltest.Reply{Calls: []modeltest.Call{{ID: fmt.Sprintf("w%d", n), Code: "await runtime.wait(None, reason='idle')"}}}
	})
	a, _ := startRemoteChildAgent(t, h, model, ws)
	a.send("spawn it")
	a.eventually("the child set x", func() bool { return a.cellSaid("child-1", "CHILD SET") })
	a.eventually("the child waits", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return childN >= 2
	})
	time.Sleep(500 * time.Millisecond) // its wait is recorded
	a.kill()
	a.start()
	// (The cell's code says "X-IS', x + 1": only its output says "X-IS 42".)
	a.eventually("the child's cell after the restart sees x = 41", func() bool { return a.cellSaid("child-1", "CHILD-X-IS 42") })
	waitUnits(t, a, h, "klbr-workbench-child-*", "klbr-workbench-child-1-1.service")
}
