package daemon

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/klbr-dev/klbr/internal/citest"
	"github.com/klbr-dev/klbr/internal/hosttest"
	"github.com/klbr-dev/klbr/internal/modeltest"
	"github.com/klbr-dev/klbr/internal/store"
)

// A child spawned with host="lab" works on the lab host: its cells and its
// commands (jobs.run without host=) run there (their nodename is the
// host's), its cells in a copy of its parent's workspace,
// its model requests are klbr-core's (the scripted model answers them), a
// reset of the root's kernel leaves its workbench and its Python state
// alone, and when it finishes its changes come back to the parent as a
// patch artifact that applies to the parent's workspace, which nothing on
// the host wrote. A host that cannot be reached at spawn refuses the spawn
// with what to do, and nothing of it is stored.
func TestRemoteChildAgent(t *testing.T) {
	h, ws := remoteChildLab(t)
	release := make(chan struct{})
	var mu sync.Mutex
	rootN, childN := 0, 0
	model := modeltest.New()
	defer model.Close()
	model.Answer(func(n int, req modeltest.Request) modeltest.Reply {
		mu.Lock()
		defer mu.Unlock()
		isChild := false
		for _, m := range req.Messages {
			if strings.Contains(content(m), "TASK-ON-HOST") && m["role"] == "user" {
				isChild = true
			}
		}
		wait := modeltest.Reply{Calls: []modeltest.Call{{ID: fmt.Sprintf("w%d", n), Code: "await runtime.wait(None, reason='idle')"}}}
		if !isChild {
			rootN++
			switch rootN {
			case 1:
				return modeltest.Reply{Calls: []modeltest.Call{{ID: "r1", Code: "try:\n    await agents.spawn(task='never', host='down')\n    print('SPAWNED DOWN')\n" +
					"except Exception as e:\n    print('DOWN REFUSED', e)\n" +
					"c = await agents.spawn(task='TASK-ON-HOST: add a line to notes.txt', host='lab')\n" +
					"w = c['spec']['workspace']\nprint('SPAWNED', c.id, w['host'], w['mode'], w['kind'])"}}}
			case 2:
				return modeltest.Reply{Calls: []modeltest.Call{{ID: "r2", Code: "await runtime.wait(None, reason='the child works')"}}}
			}
			return wait
		}
		childN++
		switch childN {
		case 1:
			return modeltest.Reply{Calls: []modeltest.Call{{ID: "k1", Code: "import os\nprint('NODE', os.uname().nodename)\nprint('CWD', os.getcwd())\n" +
				"open('notes.txt', 'a').write('from the child\\n')\nopen('new.txt', 'w').write('new\\n')\nx = 42\n" +
				"j = await jobs.run(['hostname'])\nr = await j.result(timeout=60)\nprint('JOB', r['host'], j.get('output_preview', '').strip())\nprint('EDITED')"}}}
		case 2:
			return modeltest.Reply{Hold: release, Calls: []modeltest.Call{{ID: "k2", Code: "print('STILL', os.uname().nodename, x)"}}}
		case 3:
			return modeltest.Reply{Calls: []modeltest.Call{{ID: "k3", Code: "await agents.finish({'edited': ['notes.txt', 'new.txt']})"}}}
		}
		return wait
	})

	a, data := startRemoteChildAgent(t, h, model, ws)
	a.send("work on the host")

	a.eventually("the child edited its copy and ran a command", func() bool { return a.cellSaid("child-1", "JOB lab") })
	if !a.cellSaid("default", "DOWN REFUSED refused") || !a.cellSaid("default", "unreachable") || !a.cellSaid("default", "SPAWNED 1 lab worktree copy") {
		t.Fatalf("the root's spawns:\n%s\n%s", a.dump(), a.d)
	}
	if !a.cellSaid("child-1", "NODE "+h.Hostname) {
		t.Fatalf("the child's cell did not run on the host (%s):\n%v\n%s", h.Hostname, a.sessionRecords("child-1"), a.d)
	}
	if !a.cellSaid("child-1", "JOB lab "+h.Hostname) {
		t.Fatalf("the child's command did not run on its host:\n%v\n%s", a.sessionRecords("child-1"), a.d)
	}
	if !a.cellSaid("child-1", "CWD "+h.WorkDir+"/klbr-ws-") {
		t.Fatalf("the child's cell did not work in its copy on the host:\n%v", a.sessionRecords("child-1"))
	}
	units, err := h.Units("klbr-workbench-child-1-*")
	if err != nil || len(units) != 1 {
		t.Fatalf("the child's workbench units on the host: %v %v", units, err)
	}
	if m := a.scrape(); !strings.Contains(m, `klbr_host_units{host="lab",kind="child"} 1`) {
		t.Fatalf("/metrics does not count the child on its host:\n%s", m)
	}

	// The root's kernel is reset while the child waits for its model: the
	// child's unit and its Python state are untouched.
	if _, err := a.c.Reset(t.Context(), "default", "test", true); err != nil {
		t.Fatal(err)
	}
	a.eventually("the root's kernel was reset", func() bool {
		for _, r := range a.records() {
			if r.Kind == "kernel.reset" {
				return true
			}
		}
		return false
	})
	if after, err := h.Units("klbr-workbench-child-1-*"); err != nil || strings.Join(after, " ") != strings.Join(units, " ") {
		t.Fatalf("the child's units after the root's reset: %v (before %v) %v", after, units, err)
	}
	close(release)
	a.eventually("the child's job ended", func() bool {
		j, err := a.c.Job(t.Context(), 1)
		return err == nil && j.State.Final()
	})
	if !a.cellSaid("child-1", "STILL "+h.Hostname+" 42") {
		t.Fatalf("the child's kernel did not keep its state across the root's reset:\n%v\n%s", a.sessionRecords("child-1"), a.d)
	}
	j, err := a.c.Job(t.Context(), 1)
	if err != nil || j.State != store.JobSucceeded || !strings.HasPrefix(j.OutputArtifact, "a") || j.Host != "lab" {
		t.Fatalf("the child's job: %+v %v", j, err)
	}

	// Nothing on the host wrote the parent's workspace.
	if got, _ := os.ReadFile(filepath.Join(ws, "notes.txt")); string(got) != "root\n" {
		t.Fatalf("the parent's notes.txt: %q", got)
	}
	if _, err := os.Stat(filepath.Join(ws, "new.txt")); err == nil {
		t.Fatal("the child's new.txt is in the parent's workspace")
	}
	// The patch is an artifact the parent applies, or not: here, it does.
	patch := filepath.Join(data, "artifacts", "sha256", strings.TrimPrefix(j.OutputArtifact, "a"))
	if body, err := os.ReadFile(patch); err != nil || !strings.Contains(string(body), "+from the child") || strings.Contains(string(body), "keep.txt") {
		t.Fatalf("the patch %s: %v\n%s", patch, err, body)
	}
	if out, err := exec.Command("git", "-C", ws, "apply", patch).CombinedOutput(); err != nil {
		t.Fatalf("git apply: %v\n%s", err, out)
	}
	if got, _ := os.ReadFile(filepath.Join(ws, "notes.txt")); string(got) != "root\nfrom the child\n" {
		t.Fatalf("notes.txt after the patch: %q", got)
	}
	if got, _ := os.ReadFile(filepath.Join(ws, "new.txt")); string(got) != "new\n" {
		t.Fatalf("new.txt after the patch: %q", got)
	}
	// The parent's notice names the patch.
	a.eventually("the root read its child's notice", func() bool {
		for _, req := range model.Requests() {
			if m := lastMessage(req); strings.Contains(m, "child 1 succeeded") && strings.Contains(m, j.OutputArtifact) {
				return true
			}
		}
		return false
	})
}

// remoteChildLab boots the lab host with this build's klbr-kernel and
// makes a workspace (notes.txt, sub/keep.txt) for an agent whose children
// go there.
func remoteChildLab(t *testing.T) (*hosttest.Host, string) {
	t.Helper()
	h := hosttest.Start(t)
	b, err := os.ReadFile(filepath.Join(kernelDir(t), "klbr-kernel"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(h.BinDir, "klbr-kernel"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := exec.LookPath("git"); err != nil {
		citest.SkipOrFail(t, "git is not installed")
	}
	ws := workspaceDir(t)
	for name, body := range map[string]string{"notes.txt": "root\n", "sub/keep.txt": "keep\n"} {
		os.MkdirAll(filepath.Dir(filepath.Join(ws, name)), 0o755)
		if err := os.WriteFile(filepath.Join(ws, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return h, ws
}

// startRemoteChildAgent starts klbr-core on workspace ws with the hosts
// lab (h) and down (h's address, a port nobody listens on).
func startRemoteChildAgent(t *testing.T, h *hosttest.Host, model *modeltest.Server, ws string) (*agent, string) {
	t.Helper()
	hostTOML := fmt.Sprintf("\n[hosts.lab]\nssh = %q\nidentity_file = %q\nknown_hosts_file = %q\nwork_dir = %q\nmanager = %q\n"+
		"[hosts.down]\nssh = %q\nidentity_file = %q\nknown_hosts_file = %q\n",
		h.SSH(), h.IdentityFile, h.KnownHostsFile, h.WorkDir, h.Manager,
		fmt.Sprintf("%s@%s:%d", h.User, h.Addr, h.Port+1), h.IdentityFile, h.KnownHostsFile)
	requirePython(t)
	data, env := instance(t)
	for i, e := range env {
		if strings.HasPrefix(e, "KLBR_WORKSPACE=") {
			env[i] = "KLBR_WORKSPACE=" + ws
		}
	}
	return startAgentAt(t, model, hostTOML, "", data, env), data
}

// The operator's stop of a parent cancels its child on a host, and the
// child's changes come back with the cancel: the job records the patch
// and the parent's notice names it.
func TestRemoteChildCancelledWithItsParentBringsItsPatch(t *testing.T) {
	h, ws := remoteChildLab(t)
	model := modeltest.New()
	defer model.Close()
	var mu sync.Mutex
	rootN := 0
	model.Answer(func(n int, req modeltest.Request) modeltest.Reply {
		mu.Lock()
		defer mu.Unlock()
		for _, m := range req.Messages {
			if strings.Contains(content(m), "TASK-ON-HOST") && m["role"] == "user" {
				return modeltest.Reply{Calls: []modeltest.Call{{ID: fmt.Sprintf("k%d", n), Code: "open('notes.txt', 'a').write('half done\\n')\n" +
					"print('WROTE', 'it')\nawait runtime.wait(None, reason='more later')"}}}
			}
		}
		rootN++
		if rootN == 1 {
			return modeltest.Reply{Calls: []modeltest.Call{{ID: "r1", Code: "await agents.spawn(task='TASK-ON-HOST: start on notes.txt', host='lab')\n" +
				"await runtime.wait(None, reason='the child works')"}}}
		}
		return modeltest.Reply{Calls: []modeltest.Call{{ID: fmt.Sprintf("w%d", n), Code: "await runtime.wait(None, reason='idle')"}}}
	})
	a, data := startRemoteChildAgent(t, h, model, ws)
	a.send("start a child on the host")
	a.eventually("the child wrote its copy", func() bool { return a.cellSaid("child-1", "WROTE it") })
	if _, err := a.c.StopSession(t.Context(), "default"); err != nil {
		t.Fatal(err)
	}
	a.eventually("the child was cancelled", func() bool {
		j, err := a.c.Job(t.Context(), 1)
		return err == nil && j.State == store.JobCancelled
	})
	j, _ := a.c.Job(t.Context(), 1)
	if !strings.HasPrefix(j.OutputArtifact, "a") {
		t.Fatalf("the cancelled child's job has no patch: %+v\n%s", j, a.d)
	}
	body, err := os.ReadFile(filepath.Join(data, "artifacts", "sha256", strings.TrimPrefix(j.OutputArtifact, "a")))
	if err != nil || !strings.Contains(string(body), "+half done") {
		t.Fatalf("the patch: %v\n%s", err, body)
	}
	var told bool
	for _, r := range a.records() {
		if r.Kind == "job.input" || strings.Contains(string(r.Content), "cancelled with its parent") {
			if strings.Contains(string(r.Content), j.OutputArtifact) {
				told = true
			}
		}
	}
	if !told {
		t.Fatalf("the parent's notice does not name the patch:\n%s", a.dump())
	}
	if got, _ := os.ReadFile(filepath.Join(ws, "notes.txt")); string(got) != "root\n" {
		t.Fatalf("the parent's notes.txt: %q", got)
	}
}
