package hosts

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"

	"github.com/klbr-dev/klbr/internal/hosttest"
)

func writeTree(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, body := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestPackTree(t *testing.T) {
	files := map[string]string{"pkg/__init__.py": "x = 1\n", "pkg/mod.py": "y = 2\n", "README": "r"}
	a, err := PackTree(writeTree(t, files))
	if err != nil {
		t.Fatal(err)
	}
	files["pkg/__pycache__/mod.cpython-311.pyc"] = "noise"
	b, err := PackTree(writeTree(t, files))
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(a.Tar)
	if a.Hash != b.Hash || a.Hash != hex.EncodeToString(sum[:]) {
		t.Fatalf("the same files packed to %s and %s (byte-code caches must not count)", a.Hash, b.Hash)
	}
	files["pkg/mod.py"] = "y = 3\n"
	c, err := PackTree(writeTree(t, files))
	if err != nil || c.Hash == a.Hash {
		t.Fatalf("changed content kept hash %s (%v)", c.Hash, err)
	}
	dir := writeTree(t, map[string]string{"a": "a"})
	if err := os.Symlink("/etc/passwd", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	if _, err := PackTree(dir); err == nil {
		t.Fatal("a symbolic link was packed")
	}
}

// TestPutTree: a tree reaches the host once per hash, verified, and a
// second put of the same hash sends nothing.
func TestPutTree(t *testing.T) {
	h := hosttest.Start(t)
	e := labEngine(t, h, nil)
	ctx := ctxT(t)
	tree, err := PackTree(writeTree(t, map[string]string{"klbr_runtime/__init__.py": "VERSION = 'a'\n", "klbr_runtime/runner.py": "pass\n"}))
	if err != nil {
		t.Fatal(err)
	}
	dir, sent, err := e.PutTree(ctx, "lab", tree)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(h.WorkDir, "cache", tree.Hash); dir != want || sent != int64(len(tree.Tar)) {
		t.Fatalf("first put: %s, %d bytes; want %s, %d bytes", dir, sent, want, len(tree.Tar))
	}
	if b, err := os.ReadFile(filepath.Join(dir, "klbr_runtime/__init__.py")); err != nil || string(b) != "VERSION = 'a'\n" {
		t.Fatalf("unpacked file: %q, %v", b, err)
	}
	dir2, sent, err := e.PutTree(ctx, "lab", tree)
	if err != nil || dir2 != dir || sent != 0 {
		t.Fatalf("second put of the same hash: %s, %d bytes, %v; want %s and 0 bytes", dir2, sent, err, dir)
	}

	// Bytes that do not match their hash never enter the cache.
	bad := Tree{Hash: tree.Hash[:63] + "0", Tar: tree.Tar}
	if bad.Hash == tree.Hash {
		bad.Hash = tree.Hash[:63] + "1"
	}
	if _, _, err := e.PutTree(ctx, "lab", bad); err == nil {
		t.Fatal("a tree whose bytes do not match its hash was accepted")
	}
	if _, err := os.Stat(filepath.Join(h.WorkDir, "cache", bad.Hash)); !os.IsNotExist(err) {
		t.Fatalf("the cache holds the altered tree: %v", err)
	}
	left, _ := filepath.Glob(filepath.Join(h.WorkDir, "cache", ".in-*"))
	if len(left) != 0 {
		t.Fatalf("left behind: %v", left)
	}
}
