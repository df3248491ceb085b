package workbench

import (
	"os"
	"path/filepath"
	"testing"
)

func TestBindRefusesEscapes(t *testing.T) {
	root := t.TempDir()
	outside := t.TempDir()
	os.Mkdir(filepath.Join(root, "sub"), 0o755)
	os.Symlink(outside, filepath.Join(root, "out"))
	os.Symlink(filepath.Join(root, "sub"), filepath.Join(root, "in"))
	for _, tc := range []struct {
		rel string
		ok  bool
	}{
		{"", true}, {".", true}, {"sub", true}, {"in", true}, {"sub/..", true},
		{"..", false}, {"sub/../..", false}, {"out", false}, {"/etc", false}, {"missing", false},
	} {
		got, err := Bind(root, tc.rel)
		if (err == nil) != tc.ok {
			t.Errorf("Bind(%q) = %q, %v; want ok=%v", tc.rel, got, err, tc.ok)
		}
	}
}
