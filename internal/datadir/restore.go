package datadir

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/klbr-dev/klbr/internal/celltree"
	"github.com/klbr-dev/klbr/internal/setup"
	"github.com/klbr-dev/klbr/internal/store"
)

// ErrInUse is returned for a data directory klbr-core holds.
var ErrInUse = errors.New("data directory is in use")

// ErrNotEmpty is returned for a restore target that holds anything.
var ErrNotEmpty = errors.New("data directory is not empty")

// RestoreResult is what Restore wrote.
type RestoreResult struct {
	DataDir      string `json:"data_dir"`
	Files        int    `json:"files"`
	Bytes        int64  `json:"bytes"`
	Schema       int    `json:"schema_version"`        // the backup's
	Migrated     int    `json:"migrated_to,omitempty"` // this binary's, when it migrated forward
	CreatedToken bool   `json:"created_token"`         // the backup had no operator token: a new one was made
	ConfigFile   string `json:"config_file,omitempty"` // where the backup's klbr.toml went
	// DraftGitLeftOut counts the files of drafts' .git directories the
	// backup held (an older klbr's) and restore left out (see draftGit).
	DraftGitLeftOut int `json:"draft_git_left_out,omitempty"`
}

// Restore copies the backup at src into dataDir, which must be absent or
// empty and not held by a klbr-core, verifying every file against the
// manifest (a mismatch removes what was written and fails), then makes it
// a ready data directory (init: a new operator token when the backup has
// none; the database migrated forward when the backup is older).
func Restore(ctx context.Context, src, dataDir string) (RestoreResult, error) {
	res := RestoreResult{DataDir: dataDir}
	m, err := ReadManifest(src)
	if err != nil {
		return res, fmt.Errorf("restore: %w", err)
	}
	if err := refuseLive(ctx, dataDir); err != nil {
		return res, fmt.Errorf("restore: %w", err)
	}
	if ents, err := os.ReadDir(dataDir); err == nil && len(ents) > 0 {
		return res, fmt.Errorf("restore: %w: %s holds %d entries; restore into a new or empty directory (set KLBR_DATA_DIR)", ErrNotEmpty, dataDir, len(ents))
	} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return res, fmt.Errorf("restore: %w", err)
	}
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return res, fmt.Errorf("restore: %w", err)
	}
	if err := restoreFiles(m, src, dataDir); err != nil {
		clearDir(dataDir)
		return res, fmt.Errorf("restore: %w (nothing was kept)", err)
	}
	for _, f := range m.Files {
		if draftGit(f.Path) {
			res.DraftGitLeftOut++
			continue
		}
		res.Files++
		res.Bytes += f.Size
		if f.Path == "klbr.toml" {
			res.ConfigFile = filepath.Join(dataDir, "klbr.toml")
		}
	}
	res.Schema = m.Schema
	if err := syncTree(dataDir); err != nil {
		return res, fmt.Errorf("restore: %w", err)
	}
	init, err := setup.Init(ctx, dataDir)
	if err != nil {
		return res, fmt.Errorf("restore: %w", err)
	}
	res.CreatedToken = init.CreatedToken
	if v := store.SchemaVersion(); v > m.Schema {
		res.Migrated = v
	}
	return res, nil
}

// refuseLive fails when klbr-core holds dir.
func refuseLive(ctx context.Context, dir string) error {
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	held, owner, err := store.Holder(ctx, dir)
	if err != nil {
		return err
	}
	if held {
		who := "another klbr-core"
		if owner != nil {
			who = "klbr-core " + owner.String()
		}
		return fmt.Errorf("%w: %s is held by %s; stop it first (klbr-core stop, or systemctl stop klbr-core)", ErrInUse, dir, who)
	}
	return nil
}

// draftGit reports whether rel (a slash path of a backup) lies in a .git
// directory of a draft. A draft is cell-writable, so its .git holds what a
// cell put there (hooks, config naming programs); the host never runs git
// in a draft (behavior.DraftDiff reads the files itself), so nothing of it
// is backed up or restored: no git anyone runs there later inherits it.
func draftGit(rel string) bool {
	parts := strings.Split(rel, "/")
	return len(parts) > 1 && parts[0] == "drafts" && slices.Contains(parts[1:len(parts)-1], ".git")
}

// restoreFiles copies every file of m from the backup at src into dst.
// The backup is outside input: each file is opened beneath src with no
// link followed on the way or at it, and one with other hard links is
// refused (celltree), so only what lies in the backup is restored.
func restoreFiles(m Manifest, src, dst string) error {
	root, err := celltree.Open(src)
	if err != nil {
		return err
	}
	defer root.Close()
	for _, f := range m.Files {
		if draftGit(f.Path) {
			continue
		}
		to := filepath.Join(dst, filepath.FromSlash(f.Path))
		in, err := root.OpenFile(f.Path)
		if err != nil {
			if errors.Is(err, celltree.ErrLink) || errors.Is(err, celltree.ErrHardLink) {
				return fmt.Errorf("%w: klbr restores no links; the backup is damaged or was altered", err)
			}
			return err
		}
		sum, n, err := copyHashedFrom(in, to, restoreMode(f.Path, f.Mode))
		in.Close()
		if err != nil {
			return fmt.Errorf("%s: %w", f.Path, err)
		}
		if sum != f.SHA256 || n != f.Size {
			return fmt.Errorf("%s does not match the manifest (sha256 %s, %d bytes; the manifest says %s, %d bytes): the backup is damaged", f.Path, sum, n, f.SHA256, f.Size)
		}
	}
	return nil
}

// clearDir removes everything under dir (a failed restore's partial copy).
func clearDir(dir string) {
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		filepath.WalkDir(p, func(q string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				os.Chmod(q, 0o700)
			}
			return nil
		})
		os.RemoveAll(p)
	}
}
