package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klbr-dev/klbr/internal/store"
	"github.com/klbr-dev/klbr/internal/workbench"
)

func execJSON(t *testing.T, in *instance, session, code string, extra ...string) (workbench.Result, string, error) {
	t.Helper()
	out, errOut, err := in.run(nil, append([]string{"exec", session, code, "--json"}, extra...)...)
	var res workbench.Result
	if out != "" {
		if jerr := json.Unmarshal([]byte(out), &res); jerr != nil {
			t.Fatalf("exec output: %v: %s", jerr, out)
		}
	}
	return res, errOut, err
}

// Cells run in a persistent, contained workbench per session; a crash or a
// kill in one session leaves the daemon and the other sessions alive.
func TestWorkbenchThroughTheDaemon(t *testing.T) {
	in := newInstance(t)
	in.must("init")
	// A second session, made while no daemon runs.
	st, err := store.Open(context.Background(), in.dir, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Write(context.Background(), func(tx *store.Tx) error { return tx.CreateSession("other", "") }); err != nil {
		t.Fatal(err)
	}
	st.Close()
	srv := in.serve()
	workspace := filepath.Dir(in.dir)

	if out := in.must("exec", "default", "x = 41\nprint('hi')\nx + 1"); out != "hi\n42\n" {
		t.Fatalf("exec: %q", out)
	}
	if out := in.must("exec", "other", "y = 'other session'\ny"); out != "'other session'\n" {
		t.Fatalf("exec other: %q", out)
	}
	// workspace.run through the kernel, bound to the workspace.
	os.WriteFile(filepath.Join(workspace, "note.txt"), []byte("in the workspace"), 0o644)
	if out := in.must("exec", "default", "r = await run(['cat', 'note.txt'])\n(r.exit_code, r.stdout)"); out != "(0, b'in the workspace')\n" {
		t.Fatalf("run: %q", out)
	}
	if _, errOut, err := in.run(nil, "exec", "default", "await run(['true'], cwd='..')"); err == nil || !strings.Contains(errOut, "outside the workspace") {
		t.Fatalf("cwd escape: %v %s", err, errOut)
	}
	// A command past its timeout is killed with its whole tree.
	if out := in.must("exec", "default", "r = await run(['sh', '-c', 'sleep 100 & sleep 100'], timeout=0.5)\n(r.timed_out, r.exit_code)"); out != "(True, 124)\n" {
		t.Fatalf("run timeout: %q", out)
	}
	// The worker dies: a reset outcome, the daemon serves on, the next cell gets a new generation.
	res, _, err := execJSON(t, in, "default", "import os\nos._exit(9)")
	if err == nil || !res.Outcome.Reset || res.Outcome.Generation != 1 {
		t.Fatalf("crash: %+v %v", res.Outcome, err)
	}
	res, _, err = execJSON(t, in, "default", "'x' in globals()")
	if err != nil || res.Outcome.Generation != 2 || *res.Outcome.Value != "False" {
		t.Fatalf("after the crash: %+v %v", res.Outcome, err)
	}
	// An uncooperative cell is killed at its timeout; the other session keeps its state.
	res, _, _ = execJSON(t, in, "default", "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    time.sleep(0.01)", "--timeout", "500ms")
	if !res.Outcome.Reset || res.Outcome.Status != "cancelled" {
		t.Fatalf("stubborn cell: %+v", res.Outcome)
	}
	if out := in.must("exec", "other", "y"); out != "'other session'\n" {
		t.Fatalf("the other session lost its state: %q", out)
	}
	// A context reset keeps the workbench; a kernel reset of a live
	// generation (3) starts a new one.
	in.must("exec", "default", "z = 1")
	if out := in.must("reset", "default"); !strings.Contains(out, "epoch 1 starts empty") {
		t.Fatalf("context reset: %q", out)
	}
	if out := in.must("exec", "default", "z"); out != "1\n" {
		t.Fatalf("a context reset lost the workbench: %q", out)
	}
	in.must("reset", "default", "--kernel")
	res, _, _ = execJSON(t, in, "default", "1")
	if res.Outcome.Generation != 4 {
		t.Fatalf("generation after reset: %d", res.Outcome.Generation)
	}
	// The durable record tells the story: cells, resets, generations.
	var kinds []string
	for _, line := range strings.Split(strings.TrimSpace(in.must("tail", "default", "--json")), "\n") {
		var r struct{ Kind string }
		json.Unmarshal([]byte(line), &r)
		kinds = append(kinds, r.Kind)
	}
	joined := strings.Join(kinds, " ")
	for _, want := range []string{"kernel.started", "cell.started", "cell.finished", "kernel.reset"} {
		if !strings.Contains(joined, want) {
			t.Errorf("records lack %s: %s", want, joined)
		}
	}
	if n := strings.Count(joined, "kernel.reset"); n != 3 {
		t.Errorf("%d kernel.reset records, want 3 (crash, kill, operator): %s", n, joined)
	}
	var status struct {
		Placement string
		Workbench string
	}
	json.Unmarshal([]byte(in.must("status", "--json")), &status)
	if status.Placement == "" || status.Placement == "none" || status.Workbench != "ready" {
		t.Fatalf("status: %+v", status)
	}
	_, metrics := get(t, srv.url+"metrics")
	for _, want := range []string{`klbr_placement_mode{mode="` + status.Placement + `"} 1`, `klbr_worker_events_total{event="reset",role="workbench"} 3`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	in.must("drain")
	if err := srv.wait(t); err != nil {
		t.Fatal(err)
	}
}
