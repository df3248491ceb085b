package agents

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	_ "github.com/mattn/go-sqlite3"

	"github.com/klbr-dev/klbr/internal/budget"
	"github.com/klbr-dev/klbr/internal/jobs"
	"github.com/klbr-dev/klbr/internal/store"
	"github.com/klbr-dev/klbr/internal/workspace"
)

// newTree returns agents on a store in dir (so a test can write the
// database behind the store's back, as an older klbr-core or a hand edit
// would), with a clock the test moves.
func newTree(t *testing.T) (*Agents, *store.Store, string, func(time.Duration)) {
	t.Helper()
	dir := t.TempDir()
	st, err := store.Open(context.Background(), dir, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if err := st.Write(context.Background(), func(tx *store.Tx) error { _, err := tx.EnsureSession("default"); return err }); err != nil {
		t.Fatal(err)
	}
	m := jobs.New(jobs.Config{Store: st})
	t.Cleanup(m.Close)
	now := time.Now()
	clock := func() time.Time { return now }
	advance := func(d time.Duration) { now = now.Add(d) }
	return New(Config{Store: st, Jobs: m, Clock: clock, MaxChildWall: time.Hour}), st, dir, advance
}

// speaks reports whether session may use op (nil: yes).
func speaks(st *store.Store, session, op string) error {
	_, err := Delegated(context.Background(), st, session, op, "report through agents.finish")
	return err
}

// Attack (a): the root spawns child-1 without speech; child-1 spawns a
// grandchild granting local.send (by delegate= or by a profile that
// delegates it). Before delegation narrowed, the grandchild was spawned
// with local.send and its send went out: a grandchild of an undelegated
// child spoke where its parent may not. Now the spawn is refused, naming
// what the spawner holds, and nothing is stored.
func TestUndelegatedChildCannotGrantSpeech(t *testing.T) {
	a, st, _, _ := newTree(t)
	ctx := context.Background()
	c, err := call(t, a, "default", "agents.spawn", `{"task":"quiet"}`)
	if err != nil {
		t.Fatal(err)
	}
	child := store.ChildSessionID(c.ID)
	g, err := call(t, a, child, "agents.spawn", `{"task":"speak for me","delegate":["local.send"]}`)
	if err == nil {
		if serr := speaks(st, store.ChildSessionID(g.ID), "local.send"); serr == nil {
			t.Fatalf("the grandchild %s of an undelegated child was spawned with local.send and may send", store.ChildSessionID(g.ID))
		}
		t.Fatalf("the spawn granting local.send was admitted: %s", g.Spec)
	}
	if code(err) != "refused" || !strings.Contains(err.Error(), "local.send") || !strings.Contains(err.Error(), child+" holds no speech") {
		t.Fatalf("spawn: %v; want refused, saying %s holds no speech", err, child)
	}
	if js, _ := st.Jobs(ctx, store.JobFilter{Session: child, Kind: jobs.KindChild}); len(js) != 0 {
		t.Fatalf("the refused spawn stored %d jobs", len(js))
	}
	// An ungranted grandchild is admitted, and cannot speak.
	g, err = call(t, a, child, "agents.spawn", `{"task":"stay quiet"}`)
	if err != nil {
		t.Fatal(err)
	}
	if err := speaks(st, store.ChildSessionID(g.ID), "local.send"); code(err) != "refused" {
		t.Fatalf("the grandchild's send: %v, want refused", err)
	}
}

// The same through a profile: a profile's delegate is a grant too, and a
// child holding no speech cannot pass it on.
func TestProfileCannotWidenAChildsSpeech(t *testing.T) {
	a, st := newProfiled(t, map[string]string{"profiles/speaker.toml": "description = \"speaks\"\ndelegate = [\"local.send\"]\n"})
	c, err := call(t, a, "default", "agents.spawn", `{"task":"quiet"}`)
	if err != nil {
		t.Fatal(err)
	}
	child := store.ChildSessionID(c.ID)
	g, err := call(t, a, child, "agents.spawn", `{"task":"speak","profile":"speaker"}`)
	if err == nil {
		t.Fatalf("a grandchild was spawned with profile speaker by an undelegated child: %s (may send: %v)", g.Spec,
			speaks(st, store.ChildSessionID(g.ID), "local.send") == nil)
	}
	if code(err) != "refused" || !strings.Contains(err.Error(), `profile "speaker"`) || !strings.Contains(err.Error(), child+" holds no speech") {
		t.Fatalf("spawn: %v; want refused naming the profile and what %s holds", err, child)
	}
	// The root holds every op: its child with the profile speaks.
	if c, err = call(t, a, "default", "agents.spawn", `{"task":"speak","profile":"speaker"}`); err != nil {
		t.Fatal(err)
	}
	if err := speaks(st, store.ChildSessionID(c.ID), "local.send"); err != nil {
		t.Fatalf("the root's child with profile speaker: %v", err)
	}
}

// Attack (b): child-1 holds discord.send only and grants its child
// local.send: refused at spawn, saying what it holds. What it holds it
// may pass on, and that child speaks with it only.
func TestChildGrantsOnlyTheOpsItHolds(t *testing.T) {
	a, st, _, _ := newTree(t)
	c, err := call(t, a, "default", "agents.spawn", `{"task":"talk on discord","delegate":["discord.send"]}`)
	if err != nil {
		t.Fatal(err)
	}
	child := store.ChildSessionID(c.ID)
	if g, err := call(t, a, child, "agents.spawn", `{"task":"talk locally","delegate":["local.send"]}`); err == nil {
		t.Fatalf("child-1 (discord.send) granted local.send: %s", g.Spec)
	} else if code(err) != "refused" || !strings.Contains(err.Error(), `cannot delegate local.send`) || !strings.Contains(err.Error(), child+" holds discord.send") {
		t.Fatalf("spawn: %v; want refused, naming what %s holds", err, child)
	}
	if g, err := call(t, a, child, "agents.spawn", `{"task":"both","delegate":["discord.send","discord.react"]}`); code(err) != "refused" {
		t.Fatalf("child-1 granted discord.react it does not hold: %v %s", err, g.Spec)
	}
	g, err := call(t, a, child, "agents.spawn", `{"task":"talk on discord too","delegate":["discord.send"]}`)
	if err != nil {
		t.Fatal(err)
	}
	gs := store.ChildSessionID(g.ID)
	if err := speaks(st, gs, "discord.send"); err != nil {
		t.Fatalf("the grandchild's delegated discord.send: %v", err)
	}
	if err := speaks(st, gs, "local.send"); code(err) != "refused" {
		t.Fatalf("the grandchild's local.send: %v", err)
	}
}

// At use, the grant is the intersection down the whole chain of spawners:
// a grant stored wider than the spawner's (by an older klbr-core that did
// not narrow, or a hand edit of the database) is refused at the send,
// naming the spawner that does not hold it.
func TestStoredWiderGrantIsRefusedAtUse(t *testing.T) {
	a, st, dir, _ := newTree(t)
	c, err := call(t, a, "default", "agents.spawn", `{"task":"quiet"}`)
	if err != nil {
		t.Fatal(err)
	}
	child := store.ChildSessionID(c.ID)
	g, err := call(t, a, child, "agents.spawn", `{"task":"quiet too"}`)
	if err != nil {
		t.Fatal(err)
	}
	gs := store.ChildSessionID(g.ID)
	db, err := sql.Open("sqlite3", "file:"+filepath.Join(dir, store.FileName)+"?_busy_timeout=10000&_txlock=immediate")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(`UPDATE jobs SET spec = json_set(spec, '$.delegate', json('["local.send","discord.send"]')) WHERE id = ?`, g.ID); err != nil {
		t.Fatal(err)
	}
	if j := jobOf(t, st, g.ID); !strings.Contains(string(j.Spec), "local.send") {
		t.Fatalf("the widened spec did not take: %s", j.Spec)
	}
	for _, op := range []string{"local.send", "discord.send"} {
		err := speaks(st, gs, op)
		if err == nil {
			t.Fatalf("%s: the grandchild speaks with a grant its spawner %s never held", op, child)
		}
		if code(err) != "refused" || !strings.Contains(err.Error(), "its spawner "+child+" does not hold "+op) {
			t.Fatalf("%s: %v; want refused naming %s", op, err, child)
		}
	}
}

// Attack (c), budgets: a child gives its children at most what is left of
// its own budget (and of every budget above it): a larger budget is
// clamped, an unbudgeted child gets the remainder, and a child that has
// spent a limit spawns nothing.
func TestChildBudgetIsClampedToWhatIsLeft(t *testing.T) {
	a, st, _, advance := newTree(t)
	c, err := call(t, a, "default", "agents.spawn", `{"task":"t","budget":{"tokens":1000,"model_requests":10,"wall_seconds":600}}`)
	if err != nil {
		t.Fatal(err)
	}
	child := store.ChildSessionID(c.ID)
	recordSteps(t, st, child, 2, 200)
	advance(100 * time.Second)
	for _, args := range []string{`{"task":"big","budget":{"tokens":5000,"model_requests":100,"wall_seconds":86400}}`, `{"task":"none"}`} {
		g, err := call(t, a, child, "agents.spawn", args)
		if err != nil {
			t.Fatalf("spawn %s: %v", args, err)
		}
		b, err := budget.Parse(g.Budget)
		if err != nil || b.Tokens == nil || *b.Tokens != 600 || b.ModelRequests == nil || *b.ModelRequests != 8 ||
			b.WallSeconds == nil || *b.WallSeconds > 500 || *b.WallSeconds < 499 {
			t.Fatalf("spawn %s: budget %s, want tokens 600, model_requests 8, wall_seconds 500 (what child-1 has left)", args, g.Budget)
		}
	}
	// A smaller budget is kept.
	g, err := call(t, a, child, "agents.spawn", `{"task":"small","budget":{"tokens":50}}`)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := budget.Parse(g.Budget); *b.Tokens != 50 || *b.ModelRequests != 8 {
		t.Fatalf("budget %s", g.Budget)
	}
	// Spent: nothing left to give.
	recordSteps(t, st, child, 1, 700)
	if g, err := call(t, a, child, "agents.spawn", `{"task":"more"}`); code(err) != "refused" ||
		!strings.Contains(err.Error(), "budget.tokens of "+child) || !strings.Contains(err.Error(), "1100 of 1000") {
		t.Fatalf("spawn by a child that spent its tokens: %v %s", err, g.Budget)
	}
}

// Attack (c), workspaces: a child working read-only cannot give its
// children a writable place: a shared child inherits read-only, and a
// worktree (whose making writes the repository) is refused.
func TestReadOnlyChildGivesNoWritableWorkspace(t *testing.T) {
	a, st, _, _ := newTree(t)
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "notes.txt"), []byte("root\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	a.cfg.Workspaces = &workspace.Workspaces{Root: root, Dir: filepath.Join(t.TempDir(), "worktrees"),
		Lookup: func(ctx context.Context, session string) (*workspace.Place, error) {
			j, err := st.ChildJobOf(ctx, session)
			if errors.Is(err, store.ErrNoJob) {
				return nil, nil
			}
			spec, _ := store.ChildSpecOf(j)
			return spec.Workspace, err
		}}
	c, err := call(t, a, "default", "agents.spawn", `{"task":"read","workspace":"read_only"}`)
	if err != nil {
		t.Fatal(err)
	}
	child := store.ChildSessionID(c.ID)
	if g, err := call(t, a, child, "agents.spawn", `{"task":"write","workspace":"worktree"}`); code(err) != "refused" {
		t.Fatalf("a read-only child spawned a worktree child: %v %s", err, g.Spec)
	}
	for _, mode := range []string{"shared", "read_only"} {
		g, err := call(t, a, child, "agents.spawn", `{"task":"write","workspace":"`+mode+`"}`)
		if err != nil {
			t.Fatal(err)
		}
		if spec, _ := store.ChildSpecOf(g); spec.Workspace == nil || !spec.Workspace.ReadOnly {
			t.Fatalf("%s child of a read-only child: %s, want read-only", mode, g.Spec)
		}
	}
}

// Attack (d): a child's budget covers its whole subtree. child-1 has 1000
// tokens; its two children spend 600 and 500, each within the 1000 each
// was given at spawn. Before the next model request of any of them, the
// subtree is over child-1's budget: child-1 is ended failed with the
// reason, its children cancelled with it, and no request goes out.
func TestChildBudgetCoversItsSubtree(t *testing.T) {
	a, st, _, _ := newTree(t)
	ctx := context.Background()
	c, err := call(t, a, "default", "agents.spawn", `{"task":"t","budget":{"tokens":1000}}`)
	if err != nil {
		t.Fatal(err)
	}
	child := store.ChildSessionID(c.ID)
	g1, _ := call(t, a, child, "agents.spawn", `{"task":"g1"}`)
	g2, _ := call(t, a, child, "agents.spawn", `{"task":"g2"}`)
	s1, s2 := store.ChildSessionID(g1.ID), store.ChildSessionID(g2.ID)
	recordSteps(t, st, s1, 1, 600)
	if err := a.Check(ctx, s2); err != nil {
		t.Fatalf("600 of 1000 in the subtree: %v", err)
	}
	recordSteps(t, st, s2, 1, 500)
	err = a.Check(ctx, s2)
	if !errors.Is(err, ErrExhausted) || !strings.Contains(err.Error(), "tokens 1100 of 1000 (budget.tokens of "+child+")") {
		t.Fatalf("the grandchild's next request, its subtree over child-1's budget: %v", err)
	}
	if j := jobOf(t, st, c.ID); j.State != store.JobFailed || !strings.Contains(j.Error, "tokens 1100 of 1000 (budget.tokens)") {
		t.Fatalf("child-1 %s: %s, want failed by its budget.tokens", j.State, j.Error)
	}
	for _, g := range []store.Job{g1, g2} {
		if j := jobOf(t, st, g.ID); j.State != store.JobCancelled {
			t.Fatalf("grandchild %d is %s, want cancelled with child-1", g.ID, j.State)
		}
	}
	for _, s := range []string{s1, s2, child} {
		if err := a.Check(ctx, s); err == nil {
			t.Fatalf("%s may still ask the model", s)
		}
	}
	if p, _ := st.PendingInputs(ctx, "default"); len(p) != 1 {
		t.Fatalf("the root has %d notifications, want 1", len(p))
	}
}

// A child still running under an ended child (its cancellation missed it:
// a damaged or older store) makes no model request: it is cancelled at
// its next one.
func TestCheckEndsAChildUnderAnEndedAncestor(t *testing.T) {
	a, st, dir, _ := newTree(t)
	c, _ := call(t, a, "default", "agents.spawn", `{"task":"c"}`)
	g, err := call(t, a, store.ChildSessionID(c.ID), "agents.spawn", `{"task":"g"}`)
	if err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("sqlite3", "file:"+filepath.Join(dir, store.FileName)+"?_busy_timeout=10000&_txlock=immediate")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(`UPDATE jobs SET state = 'succeeded', finished_at = started_at WHERE id = ?`, c.ID); err != nil {
		t.Fatal(err)
	}
	gs := store.ChildSessionID(g.ID)
	if err := a.Check(context.Background(), gs); !errors.Is(err, ErrEnded) || !strings.Contains(err.Error(), "child-1 above it has ended") {
		t.Fatalf("a request under an ended child: %v", err)
	}
	if j := jobOf(t, st, g.ID); j.State != store.JobCancelled {
		t.Fatalf("the grandchild is %s, want cancelled", j.State)
	}
	if s, _ := st.Session(context.Background(), gs); s.State != store.StateStopped {
		t.Fatalf("the grandchild's session is %s", s.State)
	}
}
