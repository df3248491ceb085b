package kernel

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A workspace a cell writes, with the ways it could point the login's read elsewhere:
// links at the file and at each component on the way (to a file outside, to another
// unit's directory, even to a file inside), "..", an absolute path outside, a FIFO that
// would stall a plain open, a directory, a hard link to an outside file, and a file
// larger than asked for. Each is refused, with nothing written, by the openat2 path and
// by the per-component walk alike.
func TestReadBeneathRefusals(t *testing.T) {
	base := t.TempDir()
	root := filepath.Join(base, "klbr-workbench-main-1.service")
	other := filepath.Join(base, "klbr-job-9-1.service") // another unit's directory
	for _, d := range []string{filepath.Join(root, "sub", "deeper"), other} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	write := func(p, s string) {
		t.Helper()
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(root, "report.txt"), "the report\n")
	write(filepath.Join(root, "sub", "deeper", "notes.txt"), "notes\n")
	write(filepath.Join(other, "secret"), "another unit's secret\n")
	write(filepath.Join(base, "id_ed25519"), "the login's key\n")
	link := func(target, p string) {
		t.Helper()
		if err := os.Symlink(target, p); err != nil {
			t.Fatal(err)
		}
	}
	link(filepath.Join(base, "id_ed25519"), filepath.Join(root, "key"))          // at the file
	link(other, filepath.Join(root, "other"))                                    // first component
	link(other, filepath.Join(root, "sub", "mid"))                               // a middle component
	link("report.txt", filepath.Join(root, "alias"))                             // even one inside
	link(filepath.Join(root, "sub"), filepath.Join(root, "sub", "deeper", "up")) // back up, then down
	if err := syscall.Mkfifo(filepath.Join(root, "fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(filepath.Join(base, "id_ed25519"), filepath.Join(root, "hard")); err != nil {
		t.Fatal(err)
	}
	write(filepath.Join(root, "big"), strings.Repeat("x", 101))

	cases := []struct {
		name string
		want error
	}{
		{"key", ErrReadLink},
		{"other/secret", ErrReadLink},
		{"sub/mid/secret", ErrReadLink},
		{"alias", ErrReadLink},
		{"sub/deeper/up/deeper/notes.txt", ErrReadLink},
		{filepath.Join(root, "other", "secret"), ErrReadLink},
		{"../klbr-job-9-1.service/secret", ErrReadOutside},
		{"sub/../../id_ed25519", ErrReadOutside},
		{filepath.Join(other, "secret"), ErrReadOutside},
		{root + "-evil/secret", ErrReadOutside},
		{".", ErrReadOutside},
		{"", ErrReadOutside},
		{"a\x00b", ErrReadOutside},
		{"fifo", ErrReadNotFile},
		{"sub", ErrReadNotFile},
		{"hard", ErrReadHardLink},
		{"big", ErrReadTooLarge},
		{"missing.txt", ErrReadMissing},
		{"report.txt/x", ErrReadMissing},
	}
	for _, openat2 := range []bool{true, false} {
		for _, c := range cases {
			var out bytes.Buffer
			done := make(chan error, 1)
			go func() { done <- readBeneath(root, c.name, 100, &out, openat2) }()
			var err error
			select {
			case err = <-done:
			case <-time.After(10 * time.Second):
				t.Fatalf("openat2=%v %q: the read stalls", openat2, c.name)
			}
			if !errors.Is(err, c.want) {
				t.Errorf("openat2=%v %q: got %v, want %v", openat2, c.name, err, c.want)
			}
			if out.Len() != 0 {
				t.Errorf("openat2=%v %q: wrote %q", openat2, c.name, out.String())
			}
		}
		for name, want := range map[string]string{
			"report.txt":                             "the report\n",
			"./sub/deeper/notes.txt":                 "notes\n",
			filepath.Join(root, "report.txt"):        "the report\n",
			"sub/deeper/../deeper/notes.txt":         "notes\n",
			filepath.Join(root, "sub/../report.txt"): "the report\n",
		} {
			var out bytes.Buffer
			if err := readBeneath(root, name, 100, &out, openat2); err != nil || out.String() != want {
				t.Errorf("openat2=%v %q: got %q, %v; want %q", openat2, name, out.String(), err, want)
			}
		}
	}
	// A root given through a link (the login's home behind one) still takes the real
	// path a cell's os.getcwd() reports.
	alias := filepath.Join(t.TempDir(), "work")
	link(base, alias)
	var out bytes.Buffer
	if err := ReadBeneath(filepath.Join(alias, filepath.Base(root)), filepath.Join(root, "report.txt"), 100, &out); err != nil || out.String() != "the report\n" {
		t.Errorf("through a linked root: got %q, %v", out.String(), err)
	}
}

// The subcommand of the klbr-kernel binary: the file on stdout and exit 0, or nothing on
// stdout, the reason on stderr and its own exit status.
func TestReadBeneathCommand(t *testing.T) {
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "a.txt"), []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc/passwd", filepath.Join(root, "passwd")); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, max string
		code      int
		out, err  string
	}{
		{"a.txt", "5", 0, "hello", ""},
		{"a.txt", "4", ExitReadTooLarge, "", "too large"},
		{"passwd", "100000", ExitReadRefused, "", "symbolic link"},
		{"nothing", "100", ExitReadRefused, "", "no such file"},
		{"a.txt", "-1", ExitKernel, "", "MAX"},
	} {
		var stdout, stderr bytes.Buffer
		cmd := exec.Command(kernelBin, ReadBeneathArg, root, c.name, c.max)
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		if code != c.code || stdout.String() != c.out || !strings.Contains(stderr.String(), c.err) {
			t.Errorf("%s %s: exit %d, stdout %q, stderr %q; want exit %d, %q, stderr with %q",
				c.name, c.max, code, stdout.String(), stderr.String(), c.code, c.out, c.err)
		}
	}
}
