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
	"sync"
	"time"
)

// Ref names stored content.
type Ref struct {
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
}

// Store is the artifact directory.
type Store struct {
	dir    string
	budget Budget // nil: unbounded

	// mu orders a commit that finds its content already stored against
	// garbage collection removing that content: the commit renews the
	// file's time under mu, and Remove checks that time under mu.
	mu sync.Mutex
}

// Budget is the room artifacts may take ([storage] max_bytes): a spool
// reserves each write, and gives the reservation back or turns it into a
// stored artifact. diskuse.Meter is one.
type Budget interface {
	Reserve(n int64) error
	Release(n int64)
	Committed(n int64)
}

// WithBudget bounds the spools of s by b and returns s.
func (s *Store) WithBudget(b Budget) *Store {
	s.budget = b
	return s
}

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
	// reserved is what the spool holds of the budget.
	reserved int64
}

// NewSpool starts a spool file.
func (s *Store) NewSpool() (*Spool, error) {
	f, err := os.CreateTemp(filepath.Join(s.dir, "tmp"), "spool-")
	if err != nil {
		return nil, fmt.Errorf("artifacts: %w", err)
	}
	return &Spool{store: s, f: f, h: sha256.New()}, nil
}

// Write appends to the spool. Past the store's budget it writes nothing and
// returns the budget's refusal.
func (sp *Spool) Write(p []byte) (int, error) {
	if b := sp.store.budget; b != nil {
		if err := b.Reserve(int64(len(p))); err != nil {
			return 0, err
		}
		sp.reserved += int64(len(p))
	}
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
		sp.drop(tmp)
		return ref, fmt.Errorf("artifacts: %w", err)
	}
	s := sp.store
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := os.Stat(dst); err == nil {
		// Stored already: renew its time so that garbage collection
		// counts its age from this use.
		now := time.Now()
		os.Chtimes(dst, now, now)
		sp.drop(tmp)
		return ref, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		sp.drop(tmp)
		return ref, fmt.Errorf("artifacts: %w", err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		sp.drop(tmp)
		return ref, fmt.Errorf("artifacts: %w", err)
	}
	if s.budget != nil {
		s.budget.Committed(sp.reserved)
		sp.reserved = 0
	}
	return ref, syncDir(filepath.Dir(dst))
}

// Discard drops the spool.
func (sp *Spool) Discard() {
	sp.f.Close()
	sp.drop(sp.f.Name())
}

// drop removes the spool file and gives its reservation back.
func (sp *Spool) drop(name string) {
	os.Remove(name)
	if b := sp.store.budget; b != nil && sp.reserved > 0 {
		b.Release(sp.reserved)
		sp.reserved = 0
	}
}

// Remove deletes the content of sha unless it was stored or used again at
// or after since (a commit of the same content renews its time). It says
// whether it removed it; content already gone counts as removed.
func (s *Store) Remove(sha string, since time.Time) (bool, error) {
	return s.RemoveIf(sha, since, nil)
}

// RemoveIf is Remove that first runs record (a tombstone's transaction)
// once the content is known to go, holding off commits of the same content
// until the file is gone: nothing is removed when record fails.
func (s *Store) RemoveIf(sha string, since time.Time, record func() error) (bool, error) {
	p, err := s.Path(sha)
	if err != nil {
		return false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	fi, err := os.Stat(p)
	if errors.Is(err, fs.ErrNotExist) {
		if record != nil {
			return true, record()
		}
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("artifacts: %w", err)
	}
	if !fi.ModTime().Before(since) {
		return false, nil
	}
	if record != nil {
		if err := record(); err != nil {
			return false, err
		}
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return false, fmt.Errorf("artifacts: %w", err)
	}
	return true, nil
}

// CleanSpools removes the spool files a process that ended while writing
// left behind (a kill, a full disk). Call it before anything spools.
func (s *Store) CleanSpools() (int, error) {
	dir := filepath.Join(s.dir, "tmp")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0, fmt.Errorf("artifacts: spools: %w", err)
	}
	n := 0
	for _, e := range ents {
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return n, fmt.Errorf("artifacts: spools: %w", err)
		}
		n++
	}
	return n, nil
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
