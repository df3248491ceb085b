package datadir

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/mattn/go-sqlite3" // the "sqlite3" driver: tests forge rows past the store

	"github.com/klbr-dev/klbr/internal/behavior"
	"github.com/klbr-dev/klbr/internal/setup"
	"github.com/klbr-dev/klbr/internal/store"
)

func newDataDir(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "data")
	if _, err := setup.Init(context.Background(), dir); err != nil {
		t.Fatal(err)
	}
	return dir
}

func admit(st *store.Store, key string) (int64, error) {
	var a store.Admitted
	now := time.Now()
	err := st.Write(context.Background(), func(tx *store.Tx) (err error) {
		a, err = tx.AdmitInput(store.NewInput{Session: "default", SourceKind: "operator", SourceKey: key,
			Conversation: "operator", Author: "operator", OccurredAt: now, ReceivedAt: now, Body: "hello " + key})
		return err
	})
	return a.InputID, err
}

// rawDB opens the database past the store, as someone editing it by hand.
func rawDB(t *testing.T, dir string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite3", "file:"+filepath.Join(dir, store.FileName))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func mustExec(t *testing.T, db *sql.DB, q string, args ...any) {
	t.Helper()
	if _, err := db.Exec(q, args...); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

// TestBackupDuringWriteBurstRestoresClean: a backup taken while parallel
// clients admit thousands of inputs restores into a directory whose check
// is clean and which holds every input acknowledged before the backup began.
func TestBackupDuringWriteBurstRestoresClean(t *testing.T) {
	dir := newDataDir(t)
	writeFile(t, filepath.Join(dir, "klbr.toml"), "[agent]\nroute = \"main\"\n")
	st, err := store.Open(context.Background(), dir, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	const clients, each = 16, 250
	var acked sync.Map
	var wg sync.WaitGroup
	before := make(chan struct{})
	var beforeOnce sync.Once
	stop := make(chan struct{})
	var mu sync.Mutex
	var preBackup []int64
	backupBegan := false
	for c := range clients {
		wg.Go(func() {
			for i := 0; ; i++ {
				if i >= each {
					select {
					case <-stop:
						return
					default:
					}
				}
				id, err := admit(st, fmt.Sprintf("c%d-%d", c, i))
				if err != nil {
					t.Error(err)
					return
				}
				acked.Store(id, true)
				mu.Lock()
				if !backupBegan {
					preBackup = append(preBackup, id)
				}
				n := len(preBackup)
				mu.Unlock()
				if n >= clients*each/4 {
					beforeOnce.Do(func() { close(before) })
				}
			}
		})
	}
	<-before
	mu.Lock()
	backupBegan = true
	want := append([]int64(nil), preBackup...)
	mu.Unlock()
	dest := filepath.Join(t.TempDir(), "backup")
	res, err := Backup(context.Background(), BackupOptions{DataDir: dir, ConfigFile: filepath.Join(dir, "klbr.toml"), StepPages: 16}, dest)
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if res.Database.Steps < 2 {
		t.Errorf("the backup ran in %d steps; the test wants several bounded ones", res.Database.Steps)
	}
	if !slicesContain(res.Left, "operator-token") {
		t.Errorf("the operator token was not reported as left out: %+v", res.Left)
	}
	if _, err := os.Stat(filepath.Join(dest, "operator-token")); err == nil {
		t.Error("the backup holds the operator token without --include-secrets")
	}

	target := filepath.Join(t.TempDir(), "restored")
	rr, err := Restore(context.Background(), dest, target)
	if err != nil {
		t.Fatal(err)
	}
	if !rr.CreatedToken {
		t.Error("the restore made no operator token for a backup without one")
	}
	if b, err := os.ReadFile(filepath.Join(target, "klbr.toml")); err != nil || !strings.Contains(string(b), "route") {
		t.Errorf("klbr.toml not restored: %q %v", b, err)
	}
	cr, err := Check(context.Background(), target)
	if err != nil {
		t.Fatal(err)
	}
	if !cr.Clean() {
		t.Errorf("check of the restored directory: %v", cr.Findings)
	}
	rs, err := store.Open(context.Background(), target, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	handles, err := rs.InputHandles(context.Background(), want)
	if err != nil {
		t.Fatal(err)
	}
	if len(handles) != len(want) {
		t.Fatalf("the restored directory holds %d of the %d inputs acknowledged before the backup began", len(handles), len(want))
	}
}

func slicesContain(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

func writeFile(t *testing.T, p, s string) {
	t.Helper()
	os.MkdirAll(filepath.Dir(p), 0o700)
	if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestRestoreRefusesLiveOrNonEmpty(t *testing.T) {
	src := newDataDir(t)
	dest := filepath.Join(t.TempDir(), "b")
	if _, err := Backup(context.Background(), BackupOptions{DataDir: src}, dest); err != nil {
		t.Fatal(err)
	}
	live := newDataDir(t)
	st, err := store.Open(context.Background(), live, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := Restore(context.Background(), dest, live); !errors.Is(err, ErrInUse) {
		t.Errorf("restore into a live data directory: %v, want ErrInUse", err)
	}
	full := t.TempDir()
	writeFile(t, filepath.Join(full, "something"), "x")
	if _, err := Restore(context.Background(), dest, full); !errors.Is(err, ErrNotEmpty) {
		t.Errorf("restore into a non-empty directory: %v, want ErrNotEmpty", err)
	}
	if _, err := os.Stat(filepath.Join(full, store.FileName)); err == nil {
		t.Error("the refused restore wrote into the directory")
	}
	// A damaged backup is refused and leaves nothing behind.
	db := filepath.Join(dest, store.FileName)
	b, _ := os.ReadFile(db)
	b[len(b)-1] ^= 0xff
	if err := os.WriteFile(db, b, 0o600); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(t.TempDir(), "r")
	if _, err := Restore(context.Background(), dest, target); err == nil || !strings.Contains(err.Error(), "does not match the manifest") {
		t.Errorf("restore of a damaged backup: %v", err)
	}
	if ents, _ := os.ReadDir(target); len(ents) != 0 {
		t.Errorf("a failed restore left %d entries", len(ents))
	}
	// A backup without its manifest (cut short) is refused.
	os.Remove(filepath.Join(dest, ManifestName))
	if _, err := Restore(context.Background(), dest, filepath.Join(t.TempDir(), "r2")); err == nil || !strings.Contains(err.Error(), "not a complete klbr backup") {
		t.Errorf("restore without a manifest: %v", err)
	}
}

// TestCheckFindings: check finds a deleted artifact, a modified release
// file, a forged outbox state and forged job states, each with its own
// line, and a clean directory has none.
func TestCheckFindings(t *testing.T) {
	dir := newDataDir(t)
	rel, err := behavior.Open(filepath.Join(dir, "releases"))
	if err != nil {
		t.Fatal(err)
	}
	tree := t.TempDir()
	writeFile(t, filepath.Join(tree, "soul.md"), "be kind\n")
	man, err := rel.Publish(os.DirFS(tree))
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(context.Background(), dir, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	mj := fmt.Sprintf(`{"id":%q}`, man.ID)
	if err := st.Write(context.Background(), func(tx *store.Tx) error { return tx.RecordRelease(man.ID, []byte(mj)) }); err != nil {
		t.Fatal(err)
	}
	st.Close()
	content := []byte("a long cell output")
	sum := sha256.Sum256(content)
	sha := hex.EncodeToString(sum[:])
	os.MkdirAll(filepath.Join(dir, "artifacts", "sha256"), 0o700)
	writeFile(t, filepath.Join(dir, "artifacts", "sha256", sha), string(content))
	db := rawDB(t, dir)
	mustExec(t, db, `INSERT INTO artifacts (sha256, size, media_type, created_at) VALUES (?, ?, 'text/plain', 0)`, sha, len(content))
	mustExec(t, db, `INSERT INTO discord_conversations (id, alias, kind, channel_id, created_at) VALUES (1, 'd1', 'dm', '42', 0)`)

	if cr, err := Check(context.Background(), dir); err != nil || !cr.Clean() {
		t.Fatalf("check before the damage: %+v %v", cr.Findings, err)
	}

	os.Remove(filepath.Join(dir, "artifacts", "sha256", sha))
	f := filepath.Join(rel.Tree(man.ID), "soul.md")
	os.Chmod(f, 0o600)
	writeFile(t, f, "be unkind\n")
	mustExec(t, db, `INSERT INTO discord_outbox (session_id, kind, conversation_id, idempotency_key, nonce, state, text, created_at, settled_at)
		VALUES ('default', 'send', 1, 'forged', 'n1', 'confirmed', 'hi', 0, 0)`)
	writeFile(t, filepath.Join(dir, "artifacts", "sha256", strings.Repeat("ab", 32)), "stray")
	// Jobs forged past the scheduler: running with no start, pending with no
	// deadline, succeeded with no run.
	mustExec(t, db, `INSERT INTO jobs (kind, session_id, spec, recovery, state, created_at, updated_at) VALUES ('command', 'default', '{}', 'manual', 'running', 0, 0)`)
	mustExec(t, db, `INSERT INTO jobs (kind, session_id, spec, recovery, state, created_at, updated_at) VALUES ('command', 'default', '{}', 'manual', 'pending', 0, 0)`)
	mustExec(t, db, `INSERT INTO jobs (kind, session_id, spec, recovery, state, finished_at, created_at, updated_at) VALUES ('command', 'default', '{}', 'manual', 'succeeded', 1, 0, 0)`)

	cr, err := Check(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	lines := map[string]string{}
	for _, f := range cr.Findings {
		lines[f.Check+" "+f.Problem] = f.String()
		if f.Fix == "" {
			t.Errorf("finding without what to do: %+v", f)
		}
	}
	for _, want := range []string{
		"artifacts recorded but missing",
		"outbox a confirmed send has no Discord message id",
		"outbox an effect moved past pending without a claim by the transport",
		"artifacts present but no record refers to it",
		"jobs a running job has no start time",
		"jobs a pending job has no deadline: it never runs",
		"jobs a job succeeded or failed without ever running",
	} {
		if _, ok := lines[want]; !ok {
			t.Errorf("no finding %q in %v", want, cr.Findings)
		}
	}
	found := false
	for _, f := range cr.Findings {
		if f.Check == "releases" && strings.Contains(f.Subject, man.ID) {
			found = true
		}
	}
	if !found {
		t.Errorf("the modified release file was not found: %v", cr.Findings)
	}
}

func setupInit(dir string) (setup.Result, error) { return setup.Init(context.Background(), dir) }

// A draft's .git is the cell's: hooks and config a cell wrote there are
// neither backed up nor restored (from an older backup that holds them).
func TestRestoreLeavesOutDraftsGit(t *testing.T) {
	src := newDataDir(t)
	tree := filepath.Join(src, "drafts", "d1", "tree")
	writeFile(t, filepath.Join(tree, "soul.md"), "# soul\n")
	writeFile(t, filepath.Join(tree, ".git", "hooks", "post-commit"), "#!/bin/sh\ntouch /tmp/pwned\n")
	writeFile(t, filepath.Join(tree, ".git", "config"), "[core]\n\tfsmonitor = /tmp/evil\n")
	writeFile(t, filepath.Join(tree, "sub", ".git", "hooks", "pre-commit"), "#!/bin/sh\n")
	dest := filepath.Join(t.TempDir(), "b")
	if _, err := Backup(context.Background(), BackupOptions{DataDir: src}, dest); err != nil {
		t.Fatal(err)
	}
	m, err := ReadManifest(dest)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range m.Files {
		if strings.Contains(f.Path, "/.git/") {
			t.Errorf("the backup holds %s", f.Path)
		}
	}
	// An older backup held them: restore leaves them out.
	held := map[string]bool{}
	for _, f := range m.Files {
		held[f.Path] = true
	}
	for _, rel := range []string{"drafts/d1/tree/.git/hooks/post-commit", "drafts/d1/tree/.git/config", "drafts/d1/tree/sub/.git/hooks/pre-commit"} {
		if held[rel] {
			continue
		}
		body := []byte("#!/bin/sh\ntouch /tmp/pwned\n")
		writeFile(t, filepath.Join(dest, filepath.FromSlash(rel)), string(body))
		sum := sha256.Sum256(body)
		m.Files = append(m.Files, File{Path: rel, SHA256: hex.EncodeToString(sum[:]), Size: int64(len(body)), Mode: 0o755})
	}
	mb, _ := json.MarshalIndent(m, "", "  ")
	if err := os.WriteFile(filepath.Join(dest, ManifestName), mb, 0o600); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(t.TempDir(), "r")
	if _, err := Restore(context.Background(), dest, target); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(target, "drafts", "d1", "tree", "soul.md")); err != nil || string(b) != "# soul\n" {
		t.Fatalf("the draft was not restored: %q %v", b, err)
	}
	for _, p := range []string{"drafts/d1/tree/.git", "drafts/d1/tree/sub/.git"} {
		if _, err := os.Lstat(filepath.Join(target, filepath.FromSlash(p))); err == nil {
			t.Errorf("restore wrote %s", p)
		}
	}
}

// A healthy directory with only harmless leftovers (an artifact file no
// record names: a write whose record never committed, or gc's) is clean:
// check lists the leftover as harmless and does not fail.
func TestCheckHarmlessIsClean(t *testing.T) {
	dir := newDataDir(t)
	os.MkdirAll(filepath.Join(dir, "artifacts", "sha256"), 0o700)
	writeFile(t, filepath.Join(dir, "artifacts", "sha256", strings.Repeat("cd", 32)), "stray")
	cr, err := Check(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	if !cr.Clean() || len(cr.Findings) != 1 || !cr.Findings[0].Harmless || len(cr.Problems()) != 0 {
		t.Fatalf("check with a stray artifact: clean %t, findings %+v", cr.Clean(), cr.Findings)
	}
}
