package celltree

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// workspaceOf makes a tree of files files of size bytes each, 100 to a
// directory, as a workspace without git might hold.
func workspaceOf(b *testing.B, files, size int) string {
	b.Helper()
	root := b.TempDir()
	data := make([]byte, size)
	for i := range data {
		data[i] = byte('a' + i%26)
	}
	for i := range files {
		dir := filepath.Join(root, "d"+strconv.Itoa(i/100))
		if i%100 == 0 {
			if err := os.Mkdir(dir, 0o755); err != nil {
				b.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%05d.txt", i)), data, 0o644); err != nil {
			b.Fatal(err)
		}
	}
	return root
}

// BenchmarkCopy20000 is the safe copy against the copy workspace.Make
// made before it (baselineCopy: filepath.WalkDir, os.Open by path, which
// follows links), over one 20,000-file tree of 1 KiB files, side by side.
func BenchmarkCopy20000(b *testing.B) {
	src := workspaceOf(b, 20000, 1024)
	out := b.TempDir()
	n := 0
	next := func() string { n++; return filepath.Join(out, strconv.Itoa(n)) }
	b.Run("baseline", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := baselineCopy(src, next()); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("celltree", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := Copy(src, next(), Options{MaxEntries: 20200, MaxBytes: 256 << 20}); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// baselineCopy is workspace.Make's copy before celltree, kept only as the
// benchmark's baseline: it follows a link swapped in after the listing.
func baselineCopy(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		to := filepath.Join(dst, rel)
		switch t := d.Type(); {
		case t.IsDir():
			return os.Mkdir(to, 0o755)
		case t&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return os.Symlink(target, to)
		case t.IsRegular():
			fi, err := d.Info()
			if err != nil {
				return err
			}
			in, err := os.Open(p)
			if err != nil {
				return err
			}
			defer in.Close()
			out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, fi.Mode().Perm())
			if err != nil {
				return err
			}
			if _, err := io.Copy(out, in); err != nil {
				out.Close()
				return err
			}
			return out.Close()
		}
		return nil
	})
}
