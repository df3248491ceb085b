package artifacts_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/artifacts"
	"github.com/klbr-dev/klbr/internal/diskuse"
)

// A bounded store refuses the write that would pass the bound, keeps nothing
// of the refused spool, and counts what was committed and given back.
func TestSpoolRefusedAtTheBound(t *testing.T) {
	dir := t.TempDir()
	const bound = 1 << 20
	m := diskuse.New(dir, bound, 0.8)
	s, err := artifacts.New(filepath.Join(dir, "artifacts"))
	if err != nil {
		t.Fatal(err)
	}
	s.WithBudget(m)
	chunk := bytes.Repeat([]byte("x"), 64<<10)

	sp, _ := s.NewSpool()
	for range 8 { // 512 KiB: fits
		if _, err := sp.Write(chunk); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := sp.Commit(); err != nil {
		t.Fatal(err)
	}
	if u := m.Usage(); u.Used != 8*64<<10 || u.Headroom != bound-8*64<<10 {
		t.Fatalf("after a commit: %+v", u)
	}

	sp, _ = s.NewSpool()
	var werr error
	for i := range 16 {
		if _, werr = sp.Write(append(chunk[:len(chunk):len(chunk)], byte(i))); werr != nil {
			break
		}
	}
	var full *diskuse.FullError
	if !errors.Is(werr, diskuse.ErrFull) || !errors.As(werr, &full) {
		t.Fatalf("write past the bound: %v, want ErrFull", werr)
	}
	sp.Discard()
	if u := m.Usage(); u.Used != 8*64<<10 {
		t.Fatalf("the refused spool still holds its reservation: %+v", u)
	}
	if left, _ := os.ReadDir(filepath.Join(dir, "artifacts", "tmp")); len(left) != 0 {
		t.Fatalf("spool left behind: %v", left)
	}
	if u := m.Refresh(); u.Used != 8*64<<10 || u.Warn != (float64(u.Used) >= 0.8*bound) {
		t.Fatalf("measured: %+v", u)
	}
}

// Content stored again is renewed, so Remove with an older cutoff keeps it;
// content not used since the cutoff goes.
func TestRemoveKeepsContentUsedAgain(t *testing.T) {
	s, err := artifacts.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	put := func(b string) artifacts.Ref {
		sp, _ := s.NewSpool()
		sp.Write([]byte(b))
		ref, err := sp.Commit()
		if err != nil {
			t.Fatal(err)
		}
		return ref
	}
	old, again := put("old content"), put("used again")
	past := time.Now().Add(-48 * time.Hour)
	for _, r := range []artifacts.Ref{old, again} {
		p, _ := s.Path(r.SHA256)
		os.Chtimes(p, past, past)
	}
	put("used again")
	cutoff := time.Now().Add(-24 * time.Hour)
	if ok, err := s.Remove(old.SHA256, cutoff); !ok || err != nil {
		t.Fatalf("old: %v %v", ok, err)
	}
	if ok, err := s.Remove(again.SHA256, cutoff); ok || err != nil {
		t.Fatalf("content stored again after the cutoff was removed (%v %v)", ok, err)
	}
	if p, _ := s.Path(again.SHA256); func() bool { _, err := os.Stat(p); return err != nil }() {
		t.Fatal("content used again is gone")
	}
}

func TestCleanSpools(t *testing.T) {
	dir := t.TempDir()
	s, _ := artifacts.New(dir)
	sp, _ := s.NewSpool()
	sp.Write([]byte("half written"))
	// The process ends here (a kill): the spool is never committed nor discarded.
	if n, err := s.CleanSpools(); n != 1 || err != nil {
		t.Fatalf("CleanSpools = %d, %v", n, err)
	}
	if left, _ := os.ReadDir(filepath.Join(dir, "tmp")); len(left) != 0 {
		t.Fatalf("left: %v", left)
	}
}

// BenchmarkSpoolWrite is the cost of the storage accounting per artifact
// write: the same 4 KiB writes and commit with and without a bound.
func BenchmarkSpoolWrite(b *testing.B) {
	chunk := bytes.Repeat([]byte("y"), 4096)
	for _, bounded := range []bool{false, true} {
		name := "unbounded"
		if bounded {
			name = "bounded"
		}
		b.Run(name, func(b *testing.B) {
			dir := b.TempDir()
			s, _ := artifacts.New(filepath.Join(dir, "artifacts"))
			if bounded {
				s.WithBudget(diskuse.New(dir, 1<<40, 0.8))
			}
			sp, _ := s.NewSpool()
			defer sp.Discard()
			b.SetBytes(int64(len(chunk)))
			b.ResetTimer()
			for b.Loop() {
				if _, err := sp.Write(chunk); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
