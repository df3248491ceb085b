package python

import (
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

func TestMaterializeIsContentAddressedAndIdempotent(t *testing.T) {
	dir := t.TempDir()
	src, hash, err := Materialize(dir)
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Base(filepath.Dir(src)) != hash {
		t.Fatalf("src %s is not under its hash %s", src, hash)
	}
	for _, f := range []string{"klbr_runtime/__main__.py", "klbr_runtime/framing.py", "klbr/__init__.py"} {
		b, err := os.ReadFile(filepath.Join(src, f))
		want, _ := fs.ReadFile(Source(), f)
		if err != nil || string(b) != string(want) || len(b) == 0 {
			t.Errorf("%s: materialized content differs (%v)", f, err)
		}
	}
	again, hash2, err := Materialize(dir)
	if err != nil || again != src || hash2 != hash {
		t.Fatalf("second Materialize: %s %s %v", again, hash2, err)
	}
	// The materialized tree hashes to its own name.
	if h, err := Hash(os.DirFS(src)); err != nil || h != hash {
		t.Fatalf("Hash of the materialized tree = %s %v, want %s", h, err, hash)
	}
	filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if d.Name() == "__pycache__" {
			t.Errorf("bytecode directory materialized: %s", p)
		}
		return nil
	})
}
