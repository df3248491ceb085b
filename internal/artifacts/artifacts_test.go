package artifacts

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"strings"
	"testing"
)

func TestSpoolCommitIsContentAddressedAndReadOnly(t *testing.T) {
	s, err := New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	content := strings.Repeat("line of output\n", 10000)
	var refs []Ref
	for range 2 {
		sp, err := s.NewSpool()
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < len(content); i += 4096 {
			sp.Write([]byte(content[i:min(i+4096, len(content))]))
		}
		ref, err := sp.Commit()
		if err != nil {
			t.Fatal(err)
		}
		refs = append(refs, ref)
	}
	sum := sha256.Sum256([]byte(content))
	if refs[0] != refs[1] || refs[0].SHA256 != hex.EncodeToString(sum[:]) || refs[0].Size != int64(len(content)) {
		t.Fatalf("refs %+v", refs)
	}
	p, _ := s.Path(refs[0].SHA256)
	got, err := os.ReadFile(p)
	if err != nil || string(got) != content {
		t.Fatalf("stored content differs: %v", err)
	}
	if fi, _ := os.Stat(p); fi.Mode().Perm() != 0o400 {
		t.Errorf("mode %v, want read-only", fi.Mode().Perm())
	}
	if left, _ := os.ReadDir(s.dir + "/tmp"); len(left) != 0 {
		t.Errorf("spool files left behind: %v", left)
	}
	if _, err := s.Path("../../etc/passwd"); err == nil {
		t.Error("Path accepted a non-digest")
	}
}
