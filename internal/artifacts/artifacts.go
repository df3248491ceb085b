// Package artifacts stores immutable content under <data>/artifacts,
// addressed by its SHA-256: full cell output past the preview bound, and
// later anything else too large for a record.
package artifacts

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
)

// Ref names stored content.
type Ref struct {
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
}

// Store is the artifact directory.
type Store struct{ dir string }

// New returns the store rooted at dir (<data>/artifacts), creating it.
func New(dir string) (*Store, error) {
	for _, d := range []string{dir, filepath.Join(dir, "sha256"), filepath.Join(dir, "tmp")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("artifacts: %w", err)
		}
	}
	return &Store{dir: dir}, nil
}

var hexSHA = regexp.MustCompile(`^[0-9a-f]{64}$`)

// Path is where the content of sha lives. It refuses anything but a hex digest.
func (s *Store) Path(sha string) (string, error) {
	if !hexSHA.MatchString(sha) {
		return "", fmt.Errorf("artifacts: %q is not a sha256 hex digest", sha)
	}
	return filepath.Join(s.dir, "sha256", sha), nil
}

// Spool collects content of unknown size; Commit stores it under its hash.
type Spool struct {
	store *Store
	f     *os.File
	h     hash.Hash
	n     int64
}

// NewSpool starts a spool file.
func (s *Store) NewSpool() (*Spool, error) {
	f, err := os.CreateTemp(filepath.Join(s.dir, "tmp"), "spool-")
	if err != nil {
		return nil, fmt.Errorf("artifacts: %w", err)
	}
	return &Spool{store: s, f: f, h: sha256.New()}, nil
}

// Write appends to the spool.
func (sp *Spool) Write(p []byte) (int, error) {
	n, err := sp.f.Write(p)
	sp.h.Write(p[:n])
	sp.n += int64(n)
	return n, err
}

// Size is the number of bytes written so far.
func (sp *Spool) Size() int64 { return sp.n }

// Commit syncs the content and moves it to its content address, read-only.
// Identical content already stored is kept and the spool dropped.
func (sp *Spool) Commit() (Ref, error) {
	ref := Ref{SHA256: hex.EncodeToString(sp.h.Sum(nil)), Size: sp.n}
	dst, _ := sp.store.Path(ref.SHA256)
	if err := sp.f.Sync(); err != nil {
		sp.Discard()
		return ref, fmt.Errorf("artifacts: sync: %w", err)
	}
	if err := sp.f.Chmod(0o400); err != nil {
		sp.Discard()
		return ref, fmt.Errorf("artifacts: %w", err)
	}
	tmp := sp.f.Name()
	if err := sp.f.Close(); err != nil {
		os.Remove(tmp)
		return ref, fmt.Errorf("artifacts: %w", err)
	}
	if _, err := os.Stat(dst); err == nil {
		os.Remove(tmp)
		return ref, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		os.Remove(tmp)
		return ref, fmt.Errorf("artifacts: %w", err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		os.Remove(tmp)
		return ref, fmt.Errorf("artifacts: %w", err)
	}
	return ref, syncDir(filepath.Dir(dst))
}

// Discard drops the spool.
func (sp *Spool) Discard() {
	sp.f.Close()
	os.Remove(sp.f.Name())
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("artifacts: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("artifacts: sync %s: %w", dir, err)
	}
	return nil
}
