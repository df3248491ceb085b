package datadir

import (
	"context"
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/klbr-dev/klbr/internal/store"
)

// private are the files of a data directory that hold secrets or history: the
// database, the tokens and klbr.toml are 0600; artifacts (cells' output) may be
// 0400 but never readable by anyone else.
func private(rel string) (exact fs.FileMode, ok bool) {
	switch {
	case rel == store.FileName || slicesContain(Secrets, rel) || rel == "klbr.toml" || rel == ManifestName:
		return 0o600, true
	case strings.HasPrefix(rel, "artifacts/"):
		return 0, true
	}
	return 0, false
}

// checkPrivate fails for every file under root that holds secrets or history and
// is open to group or others (or, for the database, tokens and klbr.toml, is not 0600).
func checkPrivate(t *testing.T, what, root string) {
	t.Helper()
	seen := map[string]bool{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		rel = filepath.ToSlash(rel)
		exact, ok := private(rel)
		if !ok {
			return nil
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		seen[rel] = true
		if perm := fi.Mode().Perm(); perm&0o077 != 0 || exact != 0 && perm != exact {
			t.Errorf("%s: %s has mode %v", what, rel, perm)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{store.FileName, "operator-token", "discord-token", "klbr.toml"} {
		if !seen[want] {
			t.Errorf("%s: %s is missing", what, want)
		}
	}
}

// TestBackupAndRestoreKeepSecretsAndHistoryPrivate: under the usual umask 022, a
// backup with secrets holds the database, the tokens, klbr.toml and the artifacts
// readable by their owner only, however the data directory's copies were left; a
// restore writes them so too, even from a backup whose manifest asks for 0666.
func TestBackupAndRestoreKeepSecretsAndHistoryPrivate(t *testing.T) {
	old := syscall.Umask(0o022)
	defer syscall.Umask(old)
	dir := newDataDir(t)
	st, err := store.Open(context.Background(), dir, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admit(st, "k1"); err != nil {
		t.Fatal(err)
	}
	st.Close()
	// What an operator's carelessness may leave in the data directory.
	for rel, mode := range map[string]fs.FileMode{"discord-token": 0o644, "klbr.toml": 0o644,
		"artifacts/sha256/" + strings.Repeat("ab", 32): 0o644} {
		p := filepath.Join(dir, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		writeFile(t, p, "secret or history")
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
	}
	dest := filepath.Join(t.TempDir(), "backup")
	if _, err := Backup(context.Background(), BackupOptions{DataDir: dir, ConfigFile: filepath.Join(dir, "klbr.toml"), Secrets: true}, dest); err != nil {
		t.Fatal(err)
	}
	checkPrivate(t, "backup", dest)

	// A manifest edited to ask for world-readable files.
	m, err := ReadManifest(dest)
	if err != nil {
		t.Fatal(err)
	}
	for i := range m.Files {
		if m.Files[i].Link == "" {
			m.Files[i].Mode = 0o666
		}
	}
	b, _ := json.Marshal(m)
	if err := os.WriteFile(filepath.Join(dest, ManifestName), b, 0o600); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(t.TempDir(), "restored")
	if _, err := Restore(context.Background(), dest, target); err != nil {
		t.Fatal(err)
	}
	checkPrivate(t, "restore", target)
}
