package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/api"
)

// copyTree copies a published release tree into a writable directory.
func copyTree(t *testing.T, from, to string) {
	t.Helper()
	err := filepath.WalkDir(from, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(from, p)
		dst := filepath.Join(to, rel)
		if d.IsDir() {
			return os.MkdirAll(dst, 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(dst, b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
}

func releases(t *testing.T, in *instance) api.Releases {
	t.Helper()
	var r api.Releases
	if err := json.Unmarshal([]byte(in.must("releases", "--json")), &r); err != nil {
		t.Fatal(err)
	}
	return r
}

// Seed 002's gate, from the operator's side: edit a hook, publish, activate;
// the workbench keeps its variables; a broken candidate is refused; a
// corrupted active release is restored at the next start; no model anywhere.
func TestBehaviorReleasesThroughTheDaemon(t *testing.T) {
	in := newInstance(t)
	in.must("init")
	srv := in.serve()
	r := releases(t, in)
	if len(r.Sessions) != 1 || r.Sessions[0].Epoch != 1 || r.Sessions[0].History[0].Kind != "initial" {
		t.Fatalf("initial behavior: %+v", r.Sessions)
	}
	initial := r.Sessions[0].Release

	in.must("exec", "default", "kept = 'before the activation'")

	// A hook-only edit: delivery.review now holds everything.
	draft := filepath.Join(t.TempDir(), "draft")
	copyTree(t, filepath.Join(in.dir, "releases", initial, "tree"), draft)
	os.WriteFile(filepath.Join(draft, "klbr_hooks", "__init__.py"), []byte(`
from . import attention, delivery
def review(inp):
    delivery.review(inp)  # keeps its input checks (the tree's own tests insist)
    return {"decision": "hold", "reason": "everything waits today"}
SLOTS = {"attention.plan": attention.plan, "delivery.review": review}
`), 0o644)
	id := strings.TrimSpace(in.must("publish", draft))
	if len(id) != 64 || id == initial {
		t.Fatalf("publish printed %q", id)
	}
	// A unique prefix of the id names it, as releases prints it.
	if out := in.must("activate", "default", "1", id[:10]); !strings.Contains(out, "epoch 2") || !strings.Contains(out, "hooks change") {
		t.Fatalf("activate: %s", out)
	}
	if out := in.must("exec", "default", "kept"); out != "'before the activation'\n" {
		t.Fatalf("a hook-only activation lost the workbench: %q", out)
	}
	// A stale epoch is refused.
	if _, errOut, err := in.run(nil, "activate", "default", "1", initial); err == nil || !strings.Contains(errOut, "epoch 2, not 1") {
		t.Fatalf("stale activate: %v %s", err, errOut)
	}
	// A broken candidate is refused and the active release stays.
	os.WriteFile(filepath.Join(draft, "klbr_hooks", "__init__.py"), []byte("raise ImportError('broken on purpose')\n"), 0o644)
	broken := strings.TrimSpace(in.must("publish", draft))
	if _, errOut, err := in.run(nil, "activate", "default", "2", broken); err == nil || !strings.Contains(errOut, "broken on purpose") {
		t.Fatalf("broken candidate: %v %s", err, errOut)
	}
	if r := releases(t, in); r.Sessions[0].Epoch != 2 || r.Sessions[0].Release != id {
		t.Fatalf("after a refused candidate: %+v", r.Sessions[0])
	}
	// A tree with a symlink cannot even be published.
	os.Symlink("/etc/passwd", filepath.Join(draft, "soul.md.link"))
	if _, errOut, err := in.run(nil, "publish", draft); err == nil || !strings.Contains(errOut, "symlink") {
		t.Fatalf("symlink tree: %v %s", err, errOut)
	}
	// Rollback, then roll forward again to have something to corrupt.
	if out := in.must("rollback", "default"); !strings.Contains(out, "epoch 3") || !strings.Contains(out, initial) {
		t.Fatalf("rollback: %s", out)
	}
	in.must("activate", "default", "3", id)
	in.must("drain")
	if err := srv.wait(t); err != nil {
		t.Fatal(err)
	}

	// Corrupt the active release on disk; the next start restores the last good one.
	p := filepath.Join(in.dir, "releases", id, "tree", "klbr_hooks", "__init__.py")
	os.Chmod(filepath.Dir(p), 0o755)
	os.Chmod(p, 0o644)
	os.WriteFile(p, []byte("SLOTS = {}\n"), 0o644)
	srv = in.serve()
	r = releases(t, in)
	s := r.Sessions[0]
	if s.Epoch != 5 || s.Release != initial || s.History[0].Kind != "restore" || !strings.Contains(s.History[0].Reason, "failed verification") {
		t.Fatalf("after restart over a corrupt release: %+v", s.History[0])
	}
	_, metrics := get(t, srv.url+"metrics")
	if !strings.Contains(metrics, `klbr_behavior_epoch{release="`+initial+`",session="default"} 5`) {
		t.Errorf("metrics lack the active epoch")
	}
	in.must("stop")
	srv.wait(t)
}

// Seed 002's gate, from inside a cell: the agent edits a hook through the
// SDK, tests the new release in a fresh worker, activates it; a variable set
// before survives, and the next cell sees the new behavior.
func TestAgentEditsItsOwnHookFromACell(t *testing.T) {
	in := newInstance(t)
	in.must("init")
	srv := in.serve()
	in.must("exec", "default", "kept = 'set before the edit'")
	out := in.must("exec", "default", `
d = await behavior.draft()
await d.write("klbr_hooks/strict.py", '''
from . import delivery

def review(inp):
    delivery.review(inp)  # keep the input checks
    return {"decision": "hold", "reason": "strict mode"}
''')
await hooks.bind(d, "delivery.review", "strict", "review")
pub = await behavior.publish(d)
t = await hooks.test("delivery.review", {"channel": "local", "text": "hi", "session": "default"}, release=pub.release)
a = await behavior.activate(pub.release, reason="stricter reviews")
(pub.kind, t.result["decision"], a.epoch, a.kind, a.workbench_reset_pending)`)
	if strings.TrimSpace(out) != "('hooks', 'hold', 2, 'hooks', False)" {
		t.Fatalf("edit from a cell: %q", out)
	}
	out = in.must("exec", "default", `
st = await behavior.status()
t = await hooks.test("delivery.review", {"channel": "local", "text": "hi", "session": "default"})
(kept, st.epoch, t.result["decision"], sorted(dir(skills)))`)
	if strings.TrimSpace(out) != "('set before the edit', 2, 'hold', ['code', 'discord', 'maintenance', 'workspace'])" {
		t.Fatalf("the next cell: %q", out)
	}
	// A broken candidate from a cell is refused; the active release stays.
	_, errOut, err := in.run(nil, "exec", "default", `
d = await behavior.draft()
await d.write("klbr_hooks/__init__.py", "raise RuntimeError('broken on purpose')\n")
await behavior.activate((await behavior.publish(d)).release)`)
	if err == nil || !strings.Contains(errOut, "refused") || !strings.Contains(errOut, "broken on purpose") {
		t.Fatalf("broken candidate from a cell: %v %s", err, errOut)
	}
	if r := releases(t, in); r.Sessions[0].Epoch != 2 {
		t.Fatalf("epoch after a refused candidate: %d", r.Sessions[0].Epoch)
	}
	in.must("stop")
	srv.wait(t)
}

// A cell keeps the behavior it was accepted under: an activation during the
// cell changes what the next cell sees, not what this one does.
func TestInFlightCellStaysPinnedToItsEpoch(t *testing.T) {
	in := newInstance(t)
	in.must("init")
	srv := in.serve()
	r := releases(t, in)
	initial := r.Sessions[0].Release
	draft := filepath.Join(t.TempDir(), "draft")
	copyTree(t, filepath.Join(in.dir, "releases", initial, "tree"), draft)
	os.WriteFile(filepath.Join(draft, "klbr_hooks", "strict.py"), []byte(`
from . import delivery
def review(inp):
    delivery.review(inp)
    return {"decision": "hold", "reason": "strict"}
`), 0o644)
	os.WriteFile(filepath.Join(draft, "klbr_hooks", "__init__.py"), []byte(`
from . import attention, strict
SLOTS = {"attention.plan": attention.plan, "delivery.review": strict.review}
`), 0o644)
	strict := strings.TrimSpace(in.must("publish", draft))

	probe := `
st = await behavior.status()
t = await hooks.test("delivery.review", {"channel": "local", "text": "hi", "session": "default"})
sent = await local.send("does this go out?")
(st.cell_epoch, st.epoch, t.result["decision"], sent["status"], sent["epoch"])`
	done := make(chan string, 1)
	go func() {
		out, errOut, err := in.run(nil, "exec", "default", "import asyncio\nawait asyncio.sleep(1.5)\n"+probe)
		if err != nil {
			out = err.Error() + errOut
		}
		done <- out
	}()
	time.Sleep(500 * time.Millisecond) // the cell is running
	in.must("activate", "default", "1", strict)
	if out := strings.TrimSpace(<-done); out != "(1, 2, 'allow', 'confirmed', 1)" {
		t.Fatalf("the in-flight cell: %q, want its own epoch 1 and the old review", out)
	}
	if out := strings.TrimSpace(in.must("exec", "default", probe)); out != "(2, 2, 'hold', 'held', 2)" {
		t.Fatalf("the next cell: %q", out)
	}
	in.must("stop")
	srv.wait(t)
}

// Speech is explicit: local.send is reviewed under the cell's own behavior,
// published to the speech lane with a receipt, or held with the reason. A
// review that fails holds; admission and the operator path go on.
func TestLocalSendIsReviewedAndFailsClosed(t *testing.T) {
	in := newInstance(t)
	in.must("init")
	srv := in.serve()
	if out := in.must("exec", "default", "r = await local.send('hello, operator')\n(r['status'], r['epoch'])"); strings.TrimSpace(out) != "('confirmed', 1)" {
		t.Fatalf("send under the default review: %q", out)
	}
	if out := in.must("exec", "default", "print('printing is not speech')"); !strings.Contains(out, "not speech") {
		t.Fatal(out)
	}
	// A review hook that raises: every send is held, with the reason.
	initial := releases(t, in).Sessions[0].Release
	draft := filepath.Join(t.TempDir(), "draft")
	copyTree(t, filepath.Join(in.dir, "releases", initial, "tree"), draft)
	os.WriteFile(filepath.Join(draft, "klbr_hooks", "broken.py"), []byte(`
from . import delivery
def review(inp):
    if inp.get("text") != "this should not go out":
        return delivery.review(inp)  # passes the host's candidate check
    raise RuntimeError("review bug")
`), 0o644)
	os.WriteFile(filepath.Join(draft, "klbr_hooks", "__init__.py"), []byte(`
from . import attention, broken
SLOTS = {"attention.plan": attention.plan, "delivery.review": broken.review}
`), 0o644)
	rel := strings.TrimSpace(in.must("publish", draft))
	in.must("activate", "default", "1", rel)
	out := in.must("exec", "default", "r = await local.send('this should not go out')\n(r['status'], 'review bug' in r['reason'])")
	if strings.TrimSpace(out) != "('held', True)" {
		t.Fatalf("send under a failing review: %q", out)
	}
	// Admission and operator control still work.
	in.must("send", "default", "still admitted")
	in.must("status")
	var speech []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(in.must("tail", "default", "--json")), "\n") {
		var r map[string]any
		json.Unmarshal([]byte(line), &r)
		if r["lane"] == "speech" {
			speech = append(speech, r)
		}
	}
	if len(speech) != 2 || speech[0]["kind"] != "local.sent" || speech[1]["kind"] != "local.held" {
		t.Fatalf("speech lane: %+v", speech)
	}
	if c := speech[1]["content"].(map[string]any); c["fallback"] != true || !strings.Contains(c["reason"].(string), "review bug") {
		t.Fatalf("held card: %+v", c)
	}
	_, metrics := get(t, srv.url+"metrics")
	if !strings.Contains(metrics, `klbr_delivery_reviews_held_total{fallback="true",session="default"} 1`) {
		t.Errorf("metrics lack the held review")
	}
	// The hook worker that ran the reviews counts its start, as the workbench does.
	if regexp.MustCompile(`klbr_worker_events_total\{event="started",role="hooks"\} [1-9]`).FindString(metrics) == "" {
		t.Errorf("metrics do not count the hook worker's start:\n%s", grepLines(metrics, "klbr_worker_events_total"))
	}
	in.must("stop")
	srv.wait(t)
}

// descendants lists the pids below root whose command line contains all of want.
func descendants(root int, want ...string) []int {
	parent := map[int]int{}
	cmdline := map[int]string{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		if len(f) > 1 {
			parent[pid], _ = strconv.Atoi(f[1])
		}
		c, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		cmdline[pid] = strings.ReplaceAll(string(c), "\x00", " ")
	}
	var out []int
	for pid := range parent {
		below := false
		for p := parent[pid]; p > 1; p = parent[p] {
			if p == root {
				below = true
				break
			}
		}
		match := below && !strings.Contains(cmdline[pid], "--protocol-fd") // not the kernel that started it
		for _, w := range want {
			match = match && strings.Contains(cmdline[pid], w)
		}
		if match {
			out = append(out, pid)
		}
	}
	return out
}

// The operator path works with the hook worker dead; the next review gets a
// fresh worker.
func TestOperatorPathWorksWithTheHookWorkerDead(t *testing.T) {
	in := newInstance(t)
	in.must("init")
	srv := in.serve()
	initial := releases(t, in).Sessions[0].Release
	draft := filepath.Join(t.TempDir(), "draft")
	copyTree(t, filepath.Join(in.dir, "releases", initial, "tree"), draft)
	os.WriteFile(filepath.Join(draft, "soul.md"), []byte("# a second soul\n"), 0o644)
	second := strings.TrimSpace(in.must("publish", draft))
	in.must("exec", "default", "await local.send('warm up the hook worker')")
	hooksWorkers := descendants(srv.cmd.Process.Pid, "-S -m klbr_runtime")
	if len(hooksWorkers) != 1 {
		t.Fatalf("hook workers below the daemon: %v", hooksWorkers)
	}
	syscall.Kill(hooksWorkers[0], syscall.SIGKILL)
	in.must("status")
	in.must("releases")
	if out := in.must("activate", "default", "1", second); !strings.Contains(out, "prompt change") {
		t.Fatalf("activate with the hook worker dead: %s", out)
	}
	if out := in.must("rollback", "default"); !strings.Contains(out, "epoch 3") {
		t.Fatalf("rollback with the hook worker dead: %s", out)
	}
	in.must("send", "default", "admitted while the hook worker was dead")
	if out := in.must("exec", "default", "(await local.send('after'))['status']"); strings.TrimSpace(out) != "'confirmed'" {
		t.Fatalf("send after the hook worker died: %q", out)
	}
	in.must("stop")
	srv.wait(t)
}

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
