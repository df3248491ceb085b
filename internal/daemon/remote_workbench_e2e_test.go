package daemon

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

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
