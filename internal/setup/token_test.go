package setup

import (
	"os"
	"path/filepath"
	"testing"
)

func TestRotateToken(t *testing.T) {
	dir := t.TempDir()
	if _, err := Init(t.Context(), dir); err != nil {
		t.Fatal(err)
	}
	path := TokenFile(dir)
	old, err := ReadToken(path)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := RotateToken(path)
	if err != nil {
		t.Fatal(err)
	}
	if tok == old || len(tok) != 64 {
		t.Fatalf("rotated token %q (old %q)", tok, old)
	}
	got, err := ReadToken(path)
	if err != nil || got != tok {
		t.Fatalf("read back %q, %v; want the new token", got, err)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, %v", fi.Mode().Perm(), err)
	}
	if _, err := os.Stat(filepath.Join(dir, "operator-token.new")); !os.IsNotExist(err) {
		t.Fatalf("the temporary file is left: %v", err)
	}
}
