package daemon

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klbr-dev/klbr/internal/citest"
	"github.com/klbr-dev/klbr/internal/kernel"
	"github.com/klbr-dev/klbr/internal/modeltest"
	"github.com/klbr-dev/klbr/internal/store"
)

// startWorkspaceAgent starts an agent whose workspace is ws.
func startWorkspaceAgent(t *testing.T, model *modeltest.Server, ws string) *agent {
	t.Helper()
	requirePython(t)
	if _, err := exec.LookPath("git"); err != nil {
		citest.SkipOrFail(t, "git is not installed")
	}
	data, env := instance(t)
	for i, e := range env {
		if strings.HasPrefix(e, "KLBR_WORKSPACE=") {
			env[i] = "KLBR_WORKSPACE=" + ws
		}
	}
	return startAgentAt(t, model, "", "", data, env)
}

// gitIn runs git in dir for the test.
func gitIn(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", append([]string{"-C", dir}, args...)...)
	cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null",
		"GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@t", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@t")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}

// workspaceDir is a workspace outside the system's temporary directory
// (which workers may always write, so no read-only place there is
// enforced), removed at the end.
func workspaceDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("/var/tmp", "klbr-ws-")
	if err != nil {
		citest.SkipOrFail(t, "no workspace outside /tmp: "+err.Error())
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// childWork is what every child of these tests does, whatever its mode:
// it writes its task into notes.txt, runs a command that writes run.txt,
// commits, and finishes with what happened.
const childWork = "import os\nme = await agents.current()\nws = me['spec']['workspace']\n" +
	"try:\n    f = await open_file('notes.txt')\n    await f.write(me.task + '\\n')\n    out = 'wrote'\n" +
	"except Exception as e:\n    out = f'refused {type(e).__name__}: {e}'\n" +
	"r = await run(['sh', '-c', 'echo run > run.txt'])\n" +
	"g = await run(['git', '-c', 'user.name=c', '-c', 'user.email=c@c', 'commit', '-qam', me.task])\n" +
	"await agents.finish({'mode': ws['mode'], 'dir': ws['dir'], 'cwd': os.getcwd(), 'out': out, 'run': r.exit_code, " +
	"'git': g.exit_code, 'git_err': g.stderr.decode()[-300:]})"

// childResult is childWork's result.
type childResult struct {
	Mode, Dir, Cwd, Out, GitErr string
	Run, Git                    int
}

func (a *agent) childResult(id int64) (store.Job, store.ChildSpec, childResult) {
	a.t.Helper()
	j, err := a.c.Job(a.t.Context(), id)
	if err != nil {
		a.t.Fatal(err)
	}
	spec, err := store.ChildSpecOf(j)
	if err != nil || spec.Workspace == nil {
		a.t.Fatalf("child %d: spec %s, %v", id, j.Spec, err)
	}
	var r childResult
	if j.State != store.JobSucceeded || json.Unmarshal(j.Result, &r) != nil {
		a.t.Fatalf("child %d: %s %s %s", id, j.State, j.Error, j.Result)
	}
	return j, spec, r
}

// Two modifying children at once get separate git worktrees: each writes
// notes.txt and commits in its own, the root workspace is unchanged, and
// each branch holds its child's work for the parent to merge. A read-only
// child at the same time cannot write the workspace: Landlock refuses its
// cell's and its command's writes, and its task says so.
func TestWorktreeChildrenDoNotCollide(t *testing.T) {
	if _, err := kernel.LandlockABI(); err != nil {
		citest.SkipOrFail(t, "landlock: "+err.Error())
	}
	ws := workspaceDir(t)
	gitIn(t, ws, "init", "-q", "-b", "main")
	if err := os.WriteFile(filepath.Join(ws, "notes.txt"), []byte("root\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	gitIn(t, ws, "add", "notes.txt")
	gitIn(t, ws, "commit", "-qm", "first")
	head := gitIn(t, ws, "rev-parse", "HEAD")

	model := modeltest.New()
	defer model.Close()
	model.Then(
		modeltest.Reply{Calls: []modeltest.Call{{ID: "r1", Code: "a = await agents.spawn(task='from a', workspace='worktree')\n" +
			"b = await agents.spawn(task='from b', workspace='worktree')\n" +
			"c = await agents.spawn(task='from c', workspace='read_only')\n" +
			"print('SPECS', a['spec']['workspace']['dir'], b['spec']['workspace']['dir'], c['spec']['workspace']['mode'])\n" +
			"print('DONE', await a.result(timeout=120), await b.result(timeout=120), await c.result(timeout=120))\n" +
			"print('REMOVED', (await agents.remove_workspace(a.id))['removed'] == a['spec']['workspace']['dir'])\n" +
			"try:\n    await agents.remove_workspace(c.id)\nexcept Exception as e:\n    print('NOT REMOVED', e)"}}},
		modeltest.Reply{Calls: []modeltest.Call{{ID: "k1", Code: childWork}}},
		modeltest.Reply{Calls: []modeltest.Call{{ID: "k2", Code: childWork}}},
		modeltest.Reply{Calls: []modeltest.Call{{ID: "k3", Code: childWork}}},
	)
	model.Otherwise(func(int) modeltest.Reply {
		return modeltest.Reply{Calls: []modeltest.Call{{ID: "w", Code: "await runtime.wait(None)"}}}
	})
	a := startWorkspaceAgent(t, model, ws)
	a.send("three children")
	a.eventually("the root's cell ended", func() bool { return model.Count() >= 5 })

	worktrees := filepath.Join(a.data, "worktrees")
	var dirs []string
	for _, id := range []int64{1, 2} {
		_, spec, r := a.childResult(id)
		w := spec.Workspace
		if w.Mode != "worktree" || w.Kind != "git" || w.Base != head || !strings.HasPrefix(w.Branch, "klbr/default-") ||
			filepath.Dir(w.Dir) != worktrees || w.Root != ws {
			t.Fatalf("child %d's workspace %+v", id, w)
		}
		if r.Mode != "worktree" || r.Dir != w.Dir || r.Cwd != w.Dir || r.Out != "wrote" || r.Run != 0 || r.Git != 0 {
			t.Fatalf("child %d did %+v in %+v", id, r, w)
		}
		// The first child's worktree was removed by the root after its end.
		if _, err := os.Stat(w.Dir); id == 1 && err == nil {
			t.Fatalf("child 1's removed worktree: %+v, %v", w, err)
		}
		if got, _ := os.ReadFile(filepath.Join(w.Dir, "notes.txt")); id == 2 && string(got) != spec.Task+"\n" {
			t.Fatalf("child %d's notes.txt: %q", id, got)
		}
		if got := gitIn(t, ws, "show", w.Branch+":notes.txt"); got != spec.Task {
			t.Fatalf("child %d's branch holds %q", id, got)
		}
		dirs = append(dirs, w.Dir)
	}
	if dirs[0] == dirs[1] {
		t.Fatalf("two children share %s", dirs[0])
	}
	if got, _ := os.ReadFile(filepath.Join(ws, "notes.txt")); string(got) != "root\n" {
		t.Fatalf("the root workspace's notes.txt: %q", got)
	}
	if _, err := os.Stat(filepath.Join(ws, "run.txt")); err == nil {
		t.Fatal("a child's command wrote the root workspace")
	}
	if got := gitIn(t, ws, "rev-parse", "HEAD"); got != head {
		t.Fatalf("the root's HEAD moved to %s", got)
	}

	_, spec, r := a.childResult(3)
	w := spec.Workspace
	if w.Mode != "read_only" || !w.ReadOnly || w.Dir != ws || !strings.HasPrefix(w.Enforced, "Landlock") {
		t.Fatalf("the read-only child's workspace %+v", w)
	}
	if r.Cwd != ws || !strings.HasPrefix(r.Out, "refused PermissionError") || r.Run == 0 || r.Git == 0 {
		t.Fatalf("the read-only child did %+v", r)
	}
	var told bool
	for _, req := range model.Requests() {
		if m := lastMessage(req); strings.Contains(m, "from c") && strings.Contains(m, "READ-ONLY to you") && strings.Contains(m, "Enforced: Landlock") {
			told = true
		}
	}
	if !told {
		t.Fatal("the read-only child's task does not say what is enforced")
	}
	// The parent sees where each child works in the record spawn returns.
	var saw bool
	for _, m := range model.Requests()[len(model.Requests())-1].Messages {
		if got := content(m); strings.Contains(got, "SPECS "+worktrees) && strings.Contains(got, "read_only") &&
			strings.Contains(got, "REMOVED True") && strings.Contains(got, "NOT REMOVED invalid") {
			saw = true
		}
	}
	if !saw {
		t.Fatalf("the root did not see its children's workspaces, nor removed one: %v", model.Requests()[len(model.Requests())-1].Messages)
	}
}

// A workspace that is no git repository is copied for a worktree child;
// its edit stays in the copy.
func TestWorktreeChildOfANonRepositoryGetsACopy(t *testing.T) {
	ws := workspaceDir(t)
	if err := os.WriteFile(filepath.Join(ws, "notes.txt"), []byte("root\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	model := modeltest.New()
	defer model.Close()
	model.Then(
		modeltest.Reply{Calls: []modeltest.Call{{ID: "r1", Code: "a = await agents.spawn(task='from a', workspace='worktree')\n" +
			"print('DONE', await a.result(timeout=120))"}}},
		modeltest.Reply{Calls: []modeltest.Call{{ID: "k1", Code: childWork}}},
	)
	model.Otherwise(func(int) modeltest.Reply {
		return modeltest.Reply{Calls: []modeltest.Call{{ID: "w", Code: "await runtime.wait(None)"}}}
	})
	a := startWorkspaceAgent(t, model, ws)
	a.send("one child")
	a.eventually("the root's cell ended", func() bool { return model.Count() >= 3 })
	_, spec, r := a.childResult(1)
	w := spec.Workspace
	if w.Kind != "copy" || w.Branch != "" || filepath.Dir(w.Dir) != filepath.Join(a.data, "worktrees") || r.Out != "wrote" || r.Run != 0 || r.Cwd != w.Dir {
		t.Fatalf("workspace %+v, did %+v", w, r)
	}
	if got, _ := os.ReadFile(filepath.Join(w.Dir, "notes.txt")); string(got) != "from a\n" {
		t.Fatalf("the copy's notes.txt: %q", got)
	}
	if got, _ := os.ReadFile(filepath.Join(ws, "notes.txt")); string(got) != "root\n" {
		t.Fatalf("the root workspace's notes.txt: %q", got)
	}
}

// When no worktree can be made (a repository without a commit), the spawn
// is refused and nothing of it is stored.
func TestWorktreeSpawnRefusedWithoutACommit(t *testing.T) {
	ws := workspaceDir(t)
	model := modeltest.New()
	defer model.Close()
	model.Then(
		modeltest.Reply{Calls: []modeltest.Call{{ID: "r1", Code: "try:\n    await agents.spawn(task='x', workspace='worktree')\n    print('SPAWNED')\n" +
			"except Exception as e:\n    print('REFUSED', e)"}}},
		modeltest.Reply{Text: "No child.", Calls: []modeltest.Call{{ID: "r2", Code: "await runtime.wait(None)"}}},
	)
	a := startWorkspaceAgent(t, model, ws)
	gitIn(t, ws, "init", "-q")
	a.send("a child")
	a.eventually("the root saw the refusal", func() bool { return model.Count() == 2 })
	if got := lastMessage(model.Requests()[1]); !strings.Contains(got, "REFUSED refused") || !strings.Contains(got, "no commit") {
		t.Fatalf("the root saw %q", got)
	}
	if j, err := a.c.Jobs(t.Context(), "", "", 10); err != nil || len(j.Jobs) != 0 {
		t.Fatalf("jobs %+v, %v; want none", j, err)
	}
	if _, err := a.c.Session(t.Context(), "child-1"); err == nil {
		t.Fatal("the refused child's session exists")
	}
	if ents, _ := os.ReadDir(filepath.Join(a.data, "worktrees")); len(ents) != 0 {
		t.Fatalf("left behind: %v", ents)
	}
}
