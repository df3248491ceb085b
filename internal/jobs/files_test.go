package jobs

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/klbr-dev/klbr/internal/hosts"
)

func TestMatchGlob(t *testing.T) {
	for _, c := range []struct {
		glob, name string
		want       bool
	}{
		{"out/*.txt", "out/a.txt", true},
		{"out/*.txt", "out/sub/a.txt", false},
		{"**/*.bin", "z.bin", true},
		{"**/*.bin", "a/b/c/z.bin", true},
		{"out/**", "out/a/b", true},
		{"out/**", "other/a", false},
		{"report.md", "report.md", true},
		{"*", "a/b", false},
	} {
		if got := matchGlob(c.glob, c.name); got != c.want {
			t.Errorf("matchGlob(%q, %q) = %v, want %v", c.glob, c.name, got, c.want)
		}
	}
}

func TestChecksRefuseWhatLeavesTheDirectory(t *testing.T) {
	for _, g := range []string{"../x", "/etc/*", "a/../../b", "./a", "a//b", "", "[", "out/[a"} {
		if checkGlobs([]string{g}) == nil {
			t.Errorf("glob %q admitted", g)
		}
	}
	for _, p := range []string{"../x", "/etc/passwd", "a/../b", "output", "tmp/x", "."} {
		if checkInputs([]string{p}) == nil {
			t.Errorf("input %q admitted", p)
		}
	}
	if err := checkGlobs([]string{"out/*.bin", "**/r.txt"}); err != nil {
		t.Fatal(err)
	}
}

func TestSelectOutputsBounds(t *testing.T) {
	var files []hosts.File
	for i := range MaxOutputFiles + 5 {
		files = append(files, hosts.File{Path: "out/f" + strings.Repeat("x", i%3) + string(rune('a'+i%26)) + ".txt", Size: 1})
	}
	files = append(files, hosts.File{Path: "output", Size: 1}, hosts.File{Path: "tmp/x.txt", Size: 1}, hosts.File{Path: "big.txt", Size: MaxOutputsBytes + 1})
	picked, skipped := selectOutputs(files, []string{"**/*.txt", "output", "*"})
	if len(picked) > MaxOutputFiles || len(skipped) == 0 {
		t.Fatalf("%d picked, skipped %q", len(picked), skipped)
	}
	for _, p := range picked {
		if p.Path == "output" || strings.HasPrefix(p.Path, "tmp/") || p.Path == "big.txt" {
			t.Fatalf("picked %q", p.Path)
		}
	}
}

// The same files pack to the same tree, whatever order the directory
// lists them in; a link is left out (never followed), and a named input
// that is a link is refused.
func TestPackInputs(t *testing.T) {
	ws := t.TempDir()
	secret := filepath.Join(t.TempDir(), "secret")
	os.WriteFile(secret, []byte("secret"), 0o600)
	os.MkdirAll(filepath.Join(ws, "src", "d"), 0o755)
	os.WriteFile(filepath.Join(ws, "src", "b.py"), []byte("b"), 0o644)
	os.WriteFile(filepath.Join(ws, "src", "d", "a.py"), []byte("a"), 0o755)
	os.Symlink(secret, filepath.Join(ws, "src", "l"))
	os.Symlink(filepath.Dir(secret), filepath.Join(ws, "src", "ld"))
	os.Symlink(secret, filepath.Join(ws, "top"))
	t1, skipped, err := packInputs(ws, []string{"src", "src/b.py"})
	if err != nil {
		t.Fatal(err)
	}
	if len(skipped) != 2 || strings.Contains(string(t1.Tar), "secret") {
		t.Fatalf("skipped %q; the tree holds the secret: %v", skipped, strings.Contains(string(t1.Tar), "secret"))
	}
	t2, _, err := packInputs(ws, []string{"src/b.py", "src"})
	if err != nil || t2.Hash != t1.Hash {
		t.Fatalf("packed again: %s vs %s (%v)", t2.Hash, t1.Hash, err)
	}
	if _, _, err := packInputs(ws, []string{"top"}); err == nil {
		t.Fatal("a named link was packed")
	}
	if _, _, err := packInputs(ws, []string{"src/ld/secret"}); err == nil {
		t.Fatal("a path through a link was packed")
	}
	dir := t.TempDir()
	if err := unpack(t1.Tar, dir); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "src", "d", "a.py")); string(b) != "a" {
		t.Fatalf("unpacked %q", b)
	}
}

// BenchmarkPackInputs packs a 1,000-file tree (4 KiB each) the way inputs=
// are packed (celltree: each file opened beneath the root, no link
// followed, sorted) against the baseline hosts.PackTree (filepath.WalkDir,
// opened by path), which packs the runtime and releases, side by side.
func BenchmarkPackInputs(b *testing.B) {
	ws := b.TempDir()
	data := []byte(strings.Repeat("x", 4096))
	for i := range 1000 {
		d := filepath.Join(ws, "src", "d"+strconv.Itoa(i/100))
		os.MkdirAll(d, 0o755)
		if err := os.WriteFile(filepath.Join(d, "f"+strconv.Itoa(i)), data, 0o644); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("baseline-packtree", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := hosts.PackTree(filepath.Join(ws, "src")); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("inputs", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, _, err := packInputs(ws, []string{"src"}); err != nil {
				b.Fatal(err)
			}
		}
	})
}
