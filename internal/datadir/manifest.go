package datadir

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/klbr-dev/klbr/internal/store"
)

// ManifestName is the file that marks a complete backup: it is written
// last, so a backup cut short has none and is refused by restore.
const ManifestName = "manifest.json"

// ManifestFormat is the version of the manifest's shape.
const ManifestFormat = 1

// MaxManifestBytes bounds the manifest restore reads.
const MaxManifestBytes = 64 << 20

// Manifest describes one backup.
type Manifest struct {
	Format    int               `json:"format"`
	CreatedAt time.Time         `json:"created_at"`
	Version   string            `json:"klbr_version"`
	Schema    int               `json:"schema_version"`
	Source    string            `json:"source"`  // the data directory it was taken from
	Secrets   bool              `json:"secrets"` // whether the operator token (and discord-token) are in it
	Files     []File            `json:"files"`
	Database  store.BackupStats `json:"database"`
}

// File is one file of a backup, by its slash path inside it.
type File struct {
	Path   string      `json:"path"`
	SHA256 string      `json:"sha256"`
	Size   int64       `json:"size"`
	Mode   fs.FileMode `json:"mode"`
	Link   string      `json:"link,omitempty"` // a symbolic link's target (then no content)
}

// ReadManifest reads and checks the manifest of the backup at dir.
func ReadManifest(dir string) (Manifest, error) {
	var m Manifest
	f, err := os.Open(filepath.Join(dir, ManifestName))
	if errors.Is(err, fs.ErrNotExist) {
		return m, fmt.Errorf("%s has no %s: it is not a complete klbr backup", dir, ManifestName)
	}
	if err != nil {
		return m, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxManifestBytes+1))
	if err != nil {
		return m, err
	}
	if m, err = decodeManifest(b); err != nil {
		return m, fmt.Errorf("%s: %w", dir, err)
	}
	return m, nil
}

// decodeManifest parses and checks a manifest: its size, its format, that
// every path stays inside the backup (no absolute path, no "..", no file
// under another, no path twice), and that it names no symbolic link.
func decodeManifest(b []byte) (Manifest, error) {
	var m Manifest
	if len(b) > MaxManifestBytes {
		return m, fmt.Errorf("manifest larger than %d bytes", MaxManifestBytes)
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return m, fmt.Errorf("manifest: %w", err)
	}
	if m.Format != ManifestFormat {
		return m, fmt.Errorf("manifest format %d, this klbr-core reads %d", m.Format, ManifestFormat)
	}
	seen := map[string]bool{}
	for _, fl := range m.Files {
		if err := checkRelPath(fl.Path); err != nil {
			return m, fmt.Errorf("manifest: %w", err)
		}
		if seen[fl.Path] {
			return m, fmt.Errorf("manifest names %s twice", fl.Path)
		}
		seen[fl.Path] = true
		if fl.Link != "" {
			// A link restored into the data directory would be followed
			// by whatever reads it next, as klbr-core.
			return m, fmt.Errorf("manifest: %s is a symbolic link: klbr restores no links (a backup of this klbr holds none); remove its entry from %s to restore without it", fl.Path, ManifestName)
		}
		if fl.Size < 0 || len(fl.SHA256) != 64 {
			return m, fmt.Errorf("manifest: %s has no size and SHA-256", fl.Path)
		}
	}
	for _, fl := range m.Files {
		for d := path.Dir(fl.Path); d != "."; d = path.Dir(d) {
			if seen[d] && d != fl.Path {
				return m, fmt.Errorf("manifest: %s lies under %s, which is not a directory", fl.Path, d)
			}
		}
	}
	if !seen[store.FileName] {
		return m, fmt.Errorf("manifest holds no %s", store.FileName)
	}
	return m, nil
}

// checkRelPath refuses a path that could leave the directory it is under.
func checkRelPath(p string) error {
	if p == "" || path.IsAbs(p) || path.Clean(p) != p || p == ".." || strings.HasPrefix(p, "../") || p == ManifestName {
		return fmt.Errorf("bad path %q", p)
	}
	return nil
}

// copyHashed copies src to the new file dst with mode, syncs it, and
// returns the content's SHA-256 and size. src is the operator's own file
// (klbr.toml, a token); trees go through copyHashedFrom.
func copyHashed(src, dst string, mode fs.FileMode) (string, int64, error) {
	in, err := os.Open(src)
	if err != nil {
		return "", 0, err
	}
	defer in.Close()
	return copyHashedFrom(in, dst, mode)
}

// copyHashedFrom copies in (opened by celltree, or by copyHashed) to the
// new file dst with mode, syncs it, and returns the content's SHA-256 and
// size.
func copyHashedFrom(in *os.File, dst string, mode fs.FileMode) (string, int64, error) {
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return "", 0, err
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", 0, err
	}
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(out, h), in)
	if err == nil {
		err = out.Sync()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(dst, mode.Perm())
	}
	if err != nil {
		os.Remove(dst)
		return "", 0, err
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}

// hashFile returns a file's SHA-256 and size.
func hashFile(p string) (string, int64, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return "", 0, err
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// writeFileSynced writes b to p (a new file) and syncs it.
func writeFileSynced(p string, b []byte, mode fs.FileMode) error {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
