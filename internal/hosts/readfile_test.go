package hosts

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klbr-dev/klbr/internal/hosttest"
)

// ReadBeneath over the host's connection: a file of a workspace on the host
// (relative or absolute there) comes back; a link at the file or on the
// way, a path out of the directory, more bytes than asked for are the
// kernel's refusals, with nothing written; a directory that is no unit's or
// workspace's is refused here, before anything runs on the host.
func TestReadBeneathOnAHost(t *testing.T) {
	h := hosttest.Start(t)
	h.InstallKernel(t)
	e := labEngine(t, h, nil)
	ctx := ctxT(t)
	ws := filepath.Join(h.WorkDir, "klbr-ws-abc")
	other := filepath.Join(h.WorkDir, "klbr-job-1-1.service")
	for _, d := range []string{filepath.Join(ws, "sub"), other} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for p, s := range map[string]string{filepath.Join(ws, "a.txt"): "hello\n", filepath.Join(ws, "sub", "b.txt"): "b\n", filepath.Join(other, "secret"): "secret\n"} {
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for target, name := range map[string]string{other: "out", filepath.Join(other, "secret"): "key"} {
		if err := os.Symlink(target, filepath.Join(ws, name)); err != nil {
			t.Fatal(err)
		}
	}
	for name, want := range map[string]string{"a.txt": "hello\n", filepath.Join(ws, "sub", "b.txt"): "b\n"} {
		var out bytes.Buffer
		if err := e.ReadBeneath(ctx, "lab", "", "klbr-ws-abc", name, 100, &out); err != nil || out.String() != want {
			t.Errorf("%s: %q, %v; want %q", name, out.String(), err, want)
		}
	}
	for _, c := range []struct {
		name     string
		max      int64
		tooLarge bool
		reason   string
	}{
		{"out/secret", 100, false, "symbolic link"},
		{"key", 100, false, "symbolic link"},
		{"../klbr-job-1-1.service/secret", 100, false, "not a file in the workspace"},
		{filepath.Join(other, "secret"), 100, false, "not a file in the workspace"},
		{"sub", 100, false, "not a regular file"},
		{"a.txt", 5, true, "too large"},
	} {
		var out bytes.Buffer
		err := e.ReadBeneath(ctx, "lab", "", "klbr-ws-abc", c.name, c.max, &out)
		var r *FileRefusal
		if !errors.As(err, &r) || r.TooLarge != c.tooLarge || !strings.Contains(r.Reason, c.reason) || out.Len() != 0 {
			t.Errorf("%s: %v (%+v), wrote %q; want a refusal saying %q", c.name, err, r, out.String(), c.reason)
		}
	}
	for _, dir := range []string{"..", "klbr-ws-abc/../klbr-job-1-1.service", "cache", ""} {
		var r *FileRefusal
		if err := e.ReadBeneath(ctx, "lab", "", dir, "a.txt", 100, &bytes.Buffer{}); err == nil || errors.As(err, &r) {
			t.Errorf("dir %q: %v; want it refused here", dir, err)
		}
	}
	if err := e.ReadBeneath(ctx, "lab", "klbr-kernel-elsewhere", "klbr-ws-abc", "a.txt", 100, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "not on the PATH") {
		t.Errorf("a kernel the host lacks: %v", err)
	}
}
