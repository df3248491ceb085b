package daemon

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/hosttest"
	"github.com/klbr-dev/klbr/internal/modeltest"
	"github.com/klbr-dev/klbr/internal/store"
)

// With KLBR_REMOTE_PLACEMENT=lab the root session's cells run on the lab
// host (its network namespace, its klbr.slice), keep their heap across
// cells, and reach klbr-core's history through the protocol; the host has
// no store, no model credentials and no operator token of klbr-core's.
func TestRemoteWorkbenchPlacement(t *testing.T) {
	h := hosttest.StartWorker(t)
	b, err := os.ReadFile(filepath.Join(kernelDir(t), "klbr-kernel"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(h.BinDir, "klbr-kernel"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	netns, err := h.NetNS()
	if err != nil {
		t.Fatal(err)
	}
	model := modeltest.New()
	defer model.Close()
	model.Then(
		modeltest.Reply{Calls: []modeltest.Call{{ID: "c1", Code: "import os\nprint('netns', os.readlink('/proc/self/ns/net'))\n" +
			"print('cgroup', open('/proc/self/cgroup').read().strip())\nx = 41"}}},
		modeltest.Reply{Calls: []modeltest.Call{{ID: "c2", Code: "print('x is', x + 1)"}}},
		modeltest.Reply{Calls: []modeltest.Call{{ID: "c3", Code: "r = await history.search('netns')\nprint('found', len(r) > 0)"}}},
		modeltest.Reply{Calls: []modeltest.Call{{ID: "c4", Code: "await runtime.wait(None, reason='done')"}}},
	)
	hostTOML := fmt.Sprintf("[hosts.lab]\nssh = %q\nidentity_file = %q\nknown_hosts_file = %q\nwork_dir = %q\nmanager = %q\n",
		h.SSH(), h.IdentityFile, h.KnownHostsFile, h.WorkDir, h.Manager)
	a := startAgentTOML(t, "", route("main", model, "")+hostTOML, "KLBR_REMOTE_PLACEMENT=lab")
	a.send("where do you run?")
	a.eventually("the session waits", a.state(store.StateWaiting))
	for _, want := range []string{"netns " + netns, "klbr.slice/klbr-workbench-default-", "x is 42", "found True"} {
		if !a.cellSaid("default", want) {
			t.Fatalf("no cell said %q\n%s\n%s", want, a.dump(), a.d)
		}
	}
	if st, err := a.c.Status(a.t.Context()); err != nil || st.WorkbenchHost != "lab" {
		t.Fatalf("status does not say where the workbench runs: %+v %v", st, err)
	}
	units, err := h.Units("klbr-workbench-*")
	if err != nil || len(units) != 1 {
		t.Fatalf("workbench units on the host: %v %v", units, err)
	}
	// Nothing of klbr-core's data directory went to the host: only the
	// content-addressed cache and the unit's own directory are there.
	entries, _ := os.ReadDir(h.WorkDir)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if strings.Join(names, " ") != "cache "+units[0] {
		t.Fatalf("the host's work directory holds %v", names)
	}
}

// The root's workbench runs on the host, and the host's link goes down
// between cells for longer than the host's down grace: the kernel on the
// host ends the generation (its unit goes), and when the host answers again
// klbr-core learns that the worker is gone (docs/hosts.md). The state is
// honest: before the next cell the session gets a kernel.reset notice that
// says the workbench on host lab was lost and why, status says so, the next
// cell runs in a new generation (a variable of the old one is gone, and the
// cell says so), and the lost generation's unit does not linger on the host.
func TestRemoteWorkbenchLostWithItsConnection(t *testing.T) {
	h := hosttest.Start(t)
	b, err := os.ReadFile(filepath.Join(kernelDir(t), "klbr-kernel"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(h.BinDir, "klbr-kernel"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	model := modeltest.New()
	defer model.Close()
	model.Then(
		modeltest.Reply{Calls: []modeltest.Call{{ID: "c1", Code: "x = 41\nprint('set')"}}},
		modeltest.Reply{Calls: []modeltest.Call{{ID: "c2", Code: "await runtime.wait(None)"}}},
		modeltest.Reply{Calls: []modeltest.Call{{ID: "c3", Code: "print('x is', globals().get('x'))"}}},
		modeltest.Reply{Calls: []modeltest.Call{{ID: "c4", Code: "await runtime.wait(None)"}}},
	)
	hostTOML := fmt.Sprintf("[hosts.lab]\nssh = %q\nidentity_file = %q\nknown_hosts_file = %q\nwork_dir = %q\nmanager = %q\ndown_grace_seconds = 2\n",
		h.SSH(), h.IdentityFile, h.KnownHostsFile, h.WorkDir, h.Manager)
	a := startAgentTOML(t, "", route("main", model, "")+hostTOML, "KLBR_REMOTE_PLACEMENT=lab")
	a.send("first")
	a.eventually("the session waits", func() bool { return model.Count() == 2 && a.session().State == store.StateWaiting })
	if !a.cellSaid("default", "set") {
		t.Fatalf("the first cell did not run\n%s", a.dump())
	}
	h.SetLink(t, false)
	t.Cleanup(func() { h.SetLink(t, true) })
	// The kernel on the host hears nothing (three keepalives: 15 s), waits
	// its grace, and ends the generation: the unit goes.
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(100 * time.Millisecond) {
		units, err := h.Units("klbr-workbench-*")
		if err == nil && len(units) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the workbench's unit outlived the link and its grace for 2 minutes: %v %v\n%s", units, err, a.d)
		}
	}
	h.SetLink(t, true)
	// The host answers again: klbr-core finds no kernel behind the unit's
	// socket, and the worker is gone.
	for deadline := time.Now().Add(time.Minute); !strings.Contains(a.d.String(), "the remote worker is gone"); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("klbr-core did not learn that the generation ended\n%s", a.d)
		}
	}
	a.send("second")
	a.eventually("the second turn waits", func() bool { return model.Count() == 4 && a.session().State == store.StateWaiting })
	if !a.cellSaid("default", "x is None") {
		t.Fatalf("the cell after the loss did not run in a new generation\n%s", a.dump())
	}
	resets := a.kinds(store.LaneNotice, "kernel.reset")
	if len(resets) != 1 || !strings.Contains(string(resets[0].Content), "the workbench on host lab was lost between cells") ||
		!strings.Contains(string(resets[0].Content), "Python state") {
		t.Fatalf("kernel.reset notices %v; want one that says the workbench on lab was lost", resets)
	}
	var c3 int64
	for _, r := range a.records() {
		if r.Lane == store.LaneCell && strings.Contains(string(r.Content), "x is None") && c3 == 0 {
			c3 = r.Seq
		}
	}
	if resets[0].Seq > c3 {
		t.Fatalf("the reset notice (seq %d) came after the cell it explains (seq %d)", resets[0].Seq, c3)
	}
	st, err := a.c.Status(t.Context())
	if err != nil || len(st.WorkbenchLost) != 1 || st.WorkbenchLost[0].Generation != 1 || !strings.Contains(st.WorkbenchLost[0].Reason, "lost between cells") {
		t.Fatalf("status: %+v %v; want generation 1 lost, with the reason", st.WorkbenchLost, err)
	}
	t.Logf("status: generation %d lost: %s", st.WorkbenchLost[0].Generation, st.WorkbenchLost[0].Reason)
	for deadline := time.Now().Add(time.Minute); ; {
		units, err := h.Units("klbr-workbench-*")
		if err == nil && len(units) == 1 && units[0] == "klbr-workbench-default-2.service" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("workbench units on the host: %v %v; want only generation 2", units, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// The root's workbench runs on the host, and the host's link goes down
// between cells, long enough for klbr-core to give its SSH connection up;
// it returns within the host's down grace: the worker is reattached over a
// new connection, not restarted. A variable of the first cell is there in
// the next, no kernel.reset notice, nothing lost in status, and one unit on
// the host.
func TestRemoteWorkbenchReattachedAfterADrop(t *testing.T) {
	h := hosttest.Start(t)
	b, err := os.ReadFile(filepath.Join(kernelDir(t), "klbr-kernel"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(h.BinDir, "klbr-kernel"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	model := modeltest.New()
	defer model.Close()
	model.Then(
		modeltest.Reply{Calls: []modeltest.Call{{ID: "c1", Code: "x = 41\nprint('set')"}}},
		modeltest.Reply{Calls: []modeltest.Call{{ID: "c2", Code: "await runtime.wait(None)"}}},
		modeltest.Reply{Calls: []modeltest.Call{{ID: "c3", Code: "print('x is', globals().get('x'))"}}},
		modeltest.Reply{Calls: []modeltest.Call{{ID: "c4", Code: "await runtime.wait(None)"}}},
	)
	hostTOML := fmt.Sprintf("[hosts.lab]\nssh = %q\nidentity_file = %q\nknown_hosts_file = %q\nwork_dir = %q\nmanager = %q\ndown_grace_seconds = 120\n",
		h.SSH(), h.IdentityFile, h.KnownHostsFile, h.WorkDir, h.Manager)
	a := startAgentTOML(t, "", route("main", model, "")+hostTOML, "KLBR_REMOTE_PLACEMENT=lab")
	a.send("first")
	a.eventually("the session waits", func() bool { return model.Count() == 2 && a.session().State == store.StateWaiting })
	if !a.cellSaid("default", "set") {
		t.Fatalf("the first cell did not run\n%s", a.dump())
	}
	h.SetLink(t, false)
	t.Cleanup(func() { h.SetLink(t, true) })
	// klbr-core's SSH master gives the connection up after about 15 s.
	master := func() bool {
		return exec.Command("pgrep", "-f", "ControlPersist=no -- "+h.Addr+"$").Run() == nil
	}
	for deadline := time.Now().Add(2 * time.Minute); master(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the SSH master outlived the link for 2 minutes\n%s", a.d)
		}
	}
	h.SetLink(t, true)
	a.send("second")
	a.eventually("the second turn waits", func() bool { return model.Count() == 4 && a.session().State == store.StateWaiting })
	if !a.cellSaid("default", "x is 41") {
		t.Fatalf("the cell after the drop did not run in the same generation\n%s\n%s", a.dump(), a.d)
	}
	if resets := a.kinds(store.LaneNotice, "kernel.reset"); len(resets) != 0 {
		t.Fatalf("kernel.reset notices after a reattach: %v", resets)
	}
	if st, err := a.c.Status(t.Context()); err != nil || len(st.WorkbenchLost) != 0 {
		t.Fatalf("status: %+v %v; want nothing lost", st.WorkbenchLost, err)
	}
	if units, err := h.Units("klbr-workbench-*"); err != nil || len(units) != 1 || units[0] != "klbr-workbench-default-1.service" {
		t.Fatalf("workbench units on the host: %v %v; want generation 1 only", units, err)
	}
}
