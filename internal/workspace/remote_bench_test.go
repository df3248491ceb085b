package workspace

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/klbr-dev/klbr/internal/celltree"
)

// BenchmarkCopyForHost: what a spawn on a host costs here, packing the
// workspace for the host (packTree, read with celltree), against a local
// worktree child's copy (celltree.Copy), side by side on the same tree of
// 2000 files of 4 KiB in 20 directories; and reading a host's archive of it
// back (readTree, as Patch does).
func BenchmarkCopyForHost(b *testing.B) {
	ws := b.TempDir()
	body := bytes.Repeat([]byte("x"), 4096)
	for d := range 20 {
		dir := filepath.Join(ws, fmt.Sprintf("d%02d", d))
		if err := os.Mkdir(dir, 0o755); err != nil {
			b.Fatal(err)
		}
		for f := range 100 {
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%03d.txt", f)), body, 0o644); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("op=local-copy", func(b *testing.B) {
		out := b.TempDir()
		for i := 0; b.Loop(); i++ {
			dst := filepath.Join(out, fmt.Sprint(i))
			if _, err := celltree.Copy(ws, dst, celltree.Options{MaxEntries: DefaultLimits.MaxFiles, MaxBytes: DefaultLimits.MaxBytes}); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			os.RemoveAll(dst)
			b.StartTimer()
		}
	})
	b.Run("op=pack-for-host", func(b *testing.B) {
		for b.Loop() {
			if _, _, err := packTree(ws, DefaultLimits, nil); err != nil {
				b.Fatal(err)
			}
		}
	})
	tree, _, err := packTree(ws, DefaultLimits, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("op=read-back", func(b *testing.B) {
		b.SetBytes(int64(len(tree.Tar)))
		for b.Loop() {
			if _, err := readTree(bytes.NewReader(tree.Tar), DefaultLimits, func(string, []byte) error { return nil }); err != nil {
				b.Fatal(err)
			}
		}
	})
}
