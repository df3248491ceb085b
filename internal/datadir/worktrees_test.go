package datadir

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/klbr-dev/klbr/internal/store"
)

// A worktree a child's record names is no finding; one no record names
// (a spawn that was not recorded) is, with how to remove it.
func TestCheckFindsUnrecordedWorktrees(t *testing.T) {
	dir := newDataDir(t)
	named := filepath.Join(dir, "worktrees", "default-aaaaaa")
	orphan := filepath.Join(dir, "worktrees", "default-bbbbbb")
	for _, d := range []string{named, orphan} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	st, err := store.Open(context.Background(), dir, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Write(context.Background(), func(tx *store.Tx) error {
		if _, err := tx.EnsureSession("default"); err != nil {
			return err
		}
		_, err := tx.SpawnChild(store.NewChild{Parent: "default", Task: "x",
			Workspace: &store.ChildWorkspace{Mode: store.WorkspaceWorktree, Kind: "copy", Dir: named}})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	st.Close()
	res, err := Check(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	var found []store.Finding
	for _, f := range res.Findings {
		if f.Check == "worktrees" {
			found = append(found, f)
		}
	}
	if len(found) != 1 || found[0].Subject != "worktrees/default-bbbbbb" {
		t.Fatalf("worktree findings %+v", found)
	}
}
