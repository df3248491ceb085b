package datadir

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/klbr-dev/klbr/internal/celltree"
	"github.com/klbr-dev/klbr/internal/store"
	"github.com/klbr-dev/klbr/internal/version"
)

// Trees are the data directory's durable trees a backup holds, beside the
// database and klbr.toml. runtime/ (the materialized Python runtime) and
// artifacts/tmp (spools) are rebuilt or discarded, so they are left out.
var Trees = []string{"releases", "drafts", "artifacts/sha256", "skills"}

// Secrets are the files a backup leaves out unless asked for.
var Secrets = []string{"operator-token", "discord-token"}

// BackupOptions say what to back up and where from.
type BackupOptions struct {
	DataDir    string
	ConfigFile string // klbr.toml wherever it is; "" or a missing file: none
	Secrets    bool   // include the operator token (and a discord-token in the data directory)
	StepPages  int    // pages per online-backup step; 0: store.BackupStepPages
}

// BackupResult is what Backup wrote.
type BackupResult struct {
	Dest     string            `json:"dest"`
	Files    int               `json:"files"`
	Bytes    int64             `json:"bytes"`
	Database store.BackupStats `json:"database"`
	Duration time.Duration     `json:"duration_ns"`
	MBPerSec float64           `json:"mb_per_s"`
	Left     []string          `json:"left_out"` // secrets present and not copied
	// Skipped are entries of the trees not carried, each with why: links
	// (a backup holds none), FIFOs, sockets, devices, hard-linked files.
	Skipped  []string `json:"skipped,omitempty"`
	Manifest string   `json:"manifest"`
}

// Backup writes a backup of the data directory to dest, a directory that
// must be absent or empty: first the database (an online, consistent
// snapshot; klbr-core may serve meanwhile), then the durable trees and
// klbr.toml, each file hashed into the manifest, written last.
//
// Files are copied after the database snapshot: artifacts and releases
// are written before any record names them, so everything the snapshot
// refers to is already there; a file that came later is carried along
// unreferenced, which check reports and gc removes.
func Backup(ctx context.Context, o BackupOptions, dest string) (BackupResult, error) {
	dest, err := filepath.Abs(dest)
	if err != nil {
		return BackupResult{}, err
	}
	if o.DataDir, err = filepath.Abs(o.DataDir); err != nil {
		return BackupResult{}, err
	}
	if rel, err := filepath.Rel(o.DataDir, dest); err == nil && (rel == "." || !strings.HasPrefix(rel, "..")) {
		return BackupResult{}, fmt.Errorf("backup: %s is inside the data directory %s; give a directory outside it", dest, o.DataDir)
	}
	if !fileExists(filepath.Join(o.DataDir, store.FileName)) {
		return BackupResult{}, fmt.Errorf("backup: %s holds no %s; is KLBR_DATA_DIR right?", o.DataDir, store.FileName)
	}
	return backupInto(ctx, o, dest)
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

func backupInto(ctx context.Context, o BackupOptions, dest string) (BackupResult, error) {
	start := time.Now()
	res := BackupResult{Dest: dest}
	if err := ensureEmptyDir(dest); err != nil {
		return res, fmt.Errorf("backup: %w", err)
	}
	m := Manifest{Format: ManifestFormat, CreatedAt: start.UTC(), Version: version.Version, Source: o.DataDir, Secrets: o.Secrets}
	dbStats, err := store.BackupDB(ctx, o.DataDir, filepath.Join(dest, store.FileName), o.StepPages)
	if err != nil {
		return res, err
	}
	m.Database, res.Database = dbStats, dbStats
	sum, size, err := hashFile(filepath.Join(dest, store.FileName))
	if err != nil {
		return res, fmt.Errorf("backup: %w", err)
	}
	m.Files = append(m.Files, File{Path: store.FileName, SHA256: sum, Size: size, Mode: 0o600})
	m.Schema = dbStats.Schema
	// add copies one of the operator's own files (klbr.toml, a token).
	add := func(rel, src string, fi fs.FileInfo) error {
		sum, n, err := copyHashed(src, filepath.Join(dest, filepath.FromSlash(rel)), backupMode(rel, fi.Mode()))
		if err != nil {
			return err
		}
		m.Files = append(m.Files, File{Path: rel, SHA256: sum, Size: n, Mode: restoreMode(rel, fi.Mode())})
		return nil
	}
	// The trees are written by cells (drafts) or hold what cells made
	// (artifacts): each is walked by descriptor with celltree, no link
	// followed or carried, a hard-linked file left out.
	data, err := celltree.Open(o.DataDir)
	if err != nil {
		return res, fmt.Errorf("backup: %w", err)
	}
	defer data.Close()
	skip := func(rel, why string) { res.Skipped = append(res.Skipped, rel+": "+why) }
	for _, tree := range Trees {
		root, err := data.OpenRoot(tree)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			continue
		case errors.Is(err, celltree.ErrLink):
			skip(tree, "a symbolic link (a backup holds none)")
			continue
		case err != nil:
			return res, fmt.Errorf("backup %s: %w", tree, err)
		}
		err = root.Walk(func(e *celltree.Entry) error {
			if err := ctx.Err(); err != nil {
				return err
			}
			rel := tree + "/" + e.Path
			switch {
			case e.Type.IsDir() && tree == "drafts" && strings.HasSuffix("/"+e.Path, "/.git"):
				return fs.SkipDir // the cell's (see draftGit)
			case e.Type.IsDir():
				return nil
			case e.Type&fs.ModeSymlink != 0:
				skip(rel, "a symbolic link (a backup holds none)")
				return nil
			case !e.Type.IsRegular():
				skip(rel, "not a regular file")
				return nil
			}
			in, err := e.Open()
			switch {
			case errors.Is(err, celltree.ErrLink), errors.Is(err, celltree.ErrHardLink), errors.Is(err, celltree.ErrNotRegular):
				skip(rel, err.Error())
				return nil
			case errors.Is(err, fs.ErrNotExist):
				return nil // removed since the listing
			case err != nil:
				return err
			}
			defer in.Close()
			fi, err := in.Stat()
			if err != nil {
				return err
			}
			sum, n, err := copyHashedFrom(in, filepath.Join(dest, filepath.FromSlash(rel)), backupMode(rel, fi.Mode()))
			if err != nil {
				return err
			}
			m.Files = append(m.Files, File{Path: rel, SHA256: sum, Size: n, Mode: restoreMode(rel, fi.Mode())})
			return nil
		})
		root.Close()
		if err != nil {
			return res, fmt.Errorf("backup %s: %w", tree, err)
		}
	}
	if o.ConfigFile != "" {
		if fi, err := os.Stat(o.ConfigFile); err == nil && fi.Mode().IsRegular() {
			if err := add("klbr.toml", o.ConfigFile, fi); err != nil {
				return res, fmt.Errorf("backup klbr.toml: %w", err)
			}
		}
	}
	for _, s := range Secrets {
		p := filepath.Join(o.DataDir, s)
		fi, err := os.Stat(p)
		if err != nil {
			continue
		}
		if !o.Secrets {
			res.Left = append(res.Left, s)
			continue
		}
		if err := add(s, p, fi); err != nil {
			return res, fmt.Errorf("backup %s: %w", s, err)
		}
	}
	slices.SortFunc(m.Files, func(a, b File) int {
		switch {
		case a.Path < b.Path:
			return -1
		case a.Path > b.Path:
			return 1
		}
		return 0
	})
	for _, f := range m.Files {
		res.Files++
		res.Bytes += f.Size
	}
	if err := syncTree(dest); err != nil {
		return res, fmt.Errorf("backup: %w", err)
	}
	mb, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return res, err
	}
	tmp := filepath.Join(dest, ".manifest.tmp")
	if err := writeFileSynced(tmp, append(mb, '\n'), 0o600); err != nil {
		return res, fmt.Errorf("backup: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dest, ManifestName)); err != nil {
		return res, fmt.Errorf("backup: %w", err)
	}
	if err := syncDir(dest); err != nil {
		return res, fmt.Errorf("backup: %w", err)
	}
	res.Manifest = filepath.Join(dest, ManifestName)
	res.Duration = time.Since(start)
	if s := res.Duration.Seconds(); s > 0 {
		res.MBPerSec = float64(res.Bytes) / (1 << 20) / s
	}
	return res, nil
}

// ensureEmptyDir creates dir (0700) or accepts it empty.
func ensureEmptyDir(dir string) error {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return os.MkdirAll(dir, 0o700)
	}
	if err != nil {
		return err
	}
	if len(ents) > 0 {
		return fmt.Errorf("%s is not empty (%d entries); give a new or empty directory", dir, len(ents))
	}
	return nil
}

// syncTree syncs every directory under root, so the copies' names are durable.
func syncTree(root string) error {
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			return syncDir(p)
		}
		return nil
	})
}
