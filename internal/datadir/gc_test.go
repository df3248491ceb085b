package datadir

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/behavior"
	"github.com/klbr-dev/klbr/internal/config"
	"github.com/klbr-dev/klbr/internal/store"
)

// TestGCKeepsPinned: under retention settings, garbage collection removes
// only unpinned old releases and unreferenced old artifacts, each with a
// tombstone, and keeps a pin of each kind: the active release, the last
// good one, a running attempt's, a pending job's, a draft's parent, the
// newest kept by count, and an artifact a record of the active context
// refers to. A finished job's release is not pinned.
func TestGCKeepsPinned(t *testing.T) {
	dir := newDataDir(t)
	base := time.Now().Add(-30 * 24 * time.Hour)
	clock := base
	st, err := store.Open(context.Background(), dir, store.Options{Clock: func() time.Time { return clock }})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	rel, err := behavior.Open(filepath.Join(dir, "releases"))
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]string, 7)
	for i := range ids {
		tree := t.TempDir()
		writeFile(t, filepath.Join(tree, "soul.md"), fmt.Sprintf("release %d\n", i))
		m, err := rel.Publish(os.DirFS(tree))
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = m.ID
		clock = base.Add(time.Duration(i) * time.Hour)
		write(t, st, func(tx *store.Tx) error { return tx.RecordRelease(m.ID, []byte(fmt.Sprintf(`{"id":%q}`, m.ID))) })
	}
	write(t, st, func(tx *store.Tx) error {
		if _, err := tx.Activate("default", 0, ids[1], "initial", "test"); err != nil {
			return err
		}
		_, err := tx.Activate("default", 1, ids[2], "prompt", "test") // active: 2, last good: 1
		return err
	})
	db := rawDB(t, dir)
	mustExec(t, db, `INSERT INTO attempts (session_id, wake_reason, context_epoch, release, started_at) VALUES ('default', 'input', 0, ?, 0)`, ids[3])
	mustExec(t, db, `INSERT INTO attempts (session_id, wake_reason, context_epoch, release, state, started_at, finished_at) VALUES ('default', 'input', 0, ?, 'failed', 0, 1)`, ids[4])
	write(t, st, func(tx *store.Tx) error {
		if _, err := tx.InsertJob(store.NewJob{Kind: "routine", Session: "default", Release: ids[5], Spec: json.RawMessage(`{}`),
			Recovery: "retry_safe", NextDue: time.Now().Add(time.Hour)}); err != nil {
			return err
		}
		_, err := tx.InsertJob(store.NewJob{Kind: "routine", Session: "default", Release: ids[4], Spec: json.RawMessage(`{}`), Recovery: "retry_safe"})
		return err
	})
	mustExec(t, db, `UPDATE jobs SET state = 'cancelled', next_due = NULL, finished_at = 1 WHERE release = ?`, ids[4])
	os.MkdirAll(filepath.Join(dir, "drafts", "d1"), 0o700)
	writeFile(t, filepath.Join(dir, "drafts", "d1", "draft.json"), fmt.Sprintf(`{"draft":"d1","parent_release":%q}`, ids[0]))

	// Artifacts: old and referenced by the active context, old and
	// unreferenced, young and unreferenced.
	art := func(body string, event int64, created time.Time) string {
		sum := sha256.Sum256([]byte(body))
		sha := hex.EncodeToString(sum[:])
		os.MkdirAll(filepath.Join(dir, "artifacts", "sha256"), 0o700)
		writeFile(t, filepath.Join(dir, "artifacts", "sha256", sha), body)
		var ev any
		if event > 0 {
			ev = event
		}
		mustExec(t, db, `INSERT INTO artifacts (sha256, size, media_type, event_id, created_at) VALUES (?, ?, 'text/plain', ?, ?)`, sha, len(body), ev, created.UnixMilli())
		return sha
	}
	var event int64
	write(t, st, func(tx *store.Tx) (err error) {
		event, err = tx.Notice("default", "cell", map[string]any{"text": "output in an artifact"}, true)
		return err
	})
	referenced := art("referenced output", event, base)
	old := art("old output", 0, base)
	young := art("young output", 0, time.Now())

	res, err := GC(context.Background(), st, config.Retention{ReleasesKeep: 1, ArtifactDays: 7}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	exists := func(p string) bool { _, err := os.Stat(p); return err == nil }
	for i, why := range map[int]string{0: "draft's parent", 1: "last good", 2: "active", 3: "running attempt's", 5: "pending job's", 6: "newest kept"} {
		if !exists(rel.Dir(ids[i])) {
			t.Errorf("release %d (%s) was removed", i, why)
		}
	}
	if exists(rel.Dir(ids[4])) {
		t.Error("release 4 (a failed attempt's and a cancelled job's: unpinned, old) was kept")
	}
	if !exists(filepath.Join(dir, "artifacts", "sha256", referenced)) || !exists(filepath.Join(dir, "artifacts", "sha256", young)) {
		t.Error("a referenced or young artifact was removed")
	}
	if exists(filepath.Join(dir, "artifacts", "sha256", old)) {
		t.Error("the old unreferenced artifact was kept")
	}
	if len(res.Removed) != 2 {
		t.Errorf("removed %+v, want release 4 and the old artifact", res.Removed)
	}
	stones, err := st.Tombstones(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, s := range stones {
		got[s.Ref] = s.Reason
	}
	for _, ref := range []string{ids[4], old} {
		if got[ref] == "" {
			t.Errorf("no tombstone with a reason for %s: %v", ref, stones)
		}
	}
	st.Close()
	// What gc removed is not a finding of check.
	cr, err := Check(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range cr.Findings {
		if f.Check == "releases" || (f.Check == "artifacts" && f.Problem != "present but no record refers to it") {
			t.Errorf("check after gc: %s", f)
		}
	}
}

func write(t *testing.T, st *store.Store, fn func(*store.Tx) error) {
	t.Helper()
	if err := st.Write(context.Background(), fn); err != nil {
		t.Fatal(err)
	}
}
