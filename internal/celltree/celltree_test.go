package celltree

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/klbr-dev/klbr/internal/citest"
)

// tree is a root holding a file, a subdirectory, and what leads outside:
// links to a secret file and directory, a hard link to the secret, a
// FIFO and (as root) a device.
func tree(t *testing.T) (root, secretDir string) {
	t.Helper()
	secretDir = t.TempDir()
	secret := filepath.Join(secretDir, "token")
	must(t, os.WriteFile(secret, []byte("secret"), 0o600))
	root = t.TempDir()
	must(t, os.WriteFile(filepath.Join(root, "a.txt"), []byte("a"), 0o644))
	must(t, os.Mkdir(filepath.Join(root, "sub"), 0o755))
	must(t, os.WriteFile(filepath.Join(root, "sub", "b.txt"), []byte("b"), 0o640))
	must(t, os.Symlink("a.txt", filepath.Join(root, "in-link")))
	must(t, os.Symlink(secret, filepath.Join(root, "out-link")))
	must(t, os.Symlink(secretDir, filepath.Join(root, "out-dir")))
	must(t, os.Symlink("sub", filepath.Join(root, "sub-link")))
	must(t, os.Link(secret, filepath.Join(root, "hard")))
	must(t, unix.Mkfifo(filepath.Join(root, "fifo"), 0o644))
	unix.Mknod(filepath.Join(root, "zero"), unix.S_IFCHR|0o644, int(unix.Mkdev(1, 5))) // root only
	return root, secretDir
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// modes opens root both ways: openat2 (when the kernel has it) and the
// O_NOFOLLOW walk, which the same answers are asked of.
func modes(t *testing.T, root string, fn func(t *testing.T, r *Root)) {
	for _, walk := range []bool{false, true} {
		name := map[bool]string{false: "openat2", true: "walk"}[walk]
		t.Run(name, func(t *testing.T) {
			r, err := Open(root)
			must(t, err)
			defer r.Close()
			if !walk && r.walk {
				citest.SkipOrFail(t, "this kernel has no openat2")
			}
			r.walk = walk
			fn(t, r)
		})
	}
}

func TestReadFileFollowsNothing(t *testing.T) {
	root, _ := tree(t)
	cases := []struct {
		path string
		want error // nil: reads
	}{
		{"a.txt", nil},
		{"sub/b.txt", nil},
		{"in-link", ErrLink}, // even inside: no link is followed
		{"out-link", ErrLink},
		{"out-dir/token", ErrLink},
		{"sub-link/b.txt", ErrLink},
		{"hard", ErrHardLink},
		{"fifo", ErrNotRegular},
		{"zero", ErrNotRegular},
		{"../" + filepath.Base(root) + "/a.txt", ErrBadPath},
		{"/etc/passwd", ErrBadPath},
		{"sub/../a.txt", ErrBadPath},
		{"sub", ErrNotRegular},
	}
	modes(t, root, func(t *testing.T, r *Root) {
		for _, c := range cases {
			done := make(chan struct{})
			var b []byte
			var err error
			go func() { b, err = r.ReadFile(c.path, 1<<20); close(done) }()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatalf("%s: the read blocked", c.path)
			}
			if c.path == "zero" && errors.Is(err, fs.ErrNotExist) {
				continue // not root: no device made
			}
			if c.want == nil {
				if err != nil || len(b) != 1 {
					t.Errorf("%s: %q %v", c.path, b, err)
				}
				continue
			}
			if !errors.Is(err, c.want) {
				t.Errorf("%s: %v, want %v", c.path, err, c.want)
			}
			if string(b) == "secret" {
				t.Errorf("%s: read the secret", c.path)
			}
		}
	})
}

func TestReadFileBound(t *testing.T) {
	root := t.TempDir()
	must(t, os.WriteFile(filepath.Join(root, "big"), make([]byte, 100), 0o644))
	r, err := Open(root)
	must(t, err)
	defer r.Close()
	if _, err := r.ReadFile("big", 99); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("%v, want ErrTooLarge", err)
	}
	if b, err := r.ReadFile("big", 100); err != nil || len(b) != 100 {
		t.Fatalf("%d %v", len(b), err)
	}
}

// The FS walks and reads as io/fs callers (behavior.Scan) do, and gets
// an error, not the secret, at every link.
func TestFS(t *testing.T) {
	root, _ := tree(t)
	modes(t, root, func(t *testing.T, r *Root) {
		fsys := r.FS(1 << 20)
		var seen []string
		err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			seen = append(seen, p)
			if d.Type().IsRegular() {
				b, err := fs.ReadFile(fsys, p)
				switch p {
				case "hard":
					if !errors.Is(err, ErrHardLink) {
						t.Errorf("hard: %v", err)
					}
				default:
					if err != nil || string(b) == "secret" {
						t.Errorf("%s: %q %v", p, b, err)
					}
				}
			}
			return nil
		})
		must(t, err)
		// The link to a directory is listed as a link and not entered.
		if slices.Contains(seen, "out-dir/token") || !slices.Contains(seen, "sub/b.txt") || !slices.Contains(seen, "out-dir") {
			t.Fatalf("walked %v", seen)
		}
		if _, err := fsys.Open("out-link"); !errors.Is(err, ErrLink) {
			t.Fatalf("open out-link: %v", err)
		}
		if _, err := fs.ReadDir(fsys, "out-dir"); !errors.Is(err, ErrLink) {
			t.Fatalf("readdir out-dir: %v", err)
		}
		if fi, err := fs.Stat(fsys, "out-link"); err != nil || fi.Mode()&fs.ModeSymlink == 0 {
			t.Fatalf("stat out-link: %v %v", fi, err)
		}
	})
}

func TestCopy(t *testing.T) {
	root, _ := tree(t)
	dst := filepath.Join(t.TempDir(), "copy")
	res, err := Copy(root, dst, Options{})
	if !errors.Is(err, ErrHardLink) {
		t.Fatalf("copy with a hard link: %v, want ErrHardLink", err)
	}
	if _, err := os.Lstat(dst); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("a refused copy left %s: %v", dst, err)
	}
	must(t, os.Remove(filepath.Join(root, "hard")))
	res, err = Copy(root, dst, Options{})
	must(t, err)
	got := map[string]string{}
	filepath.WalkDir(dst, func(p string, d fs.DirEntry, err error) error {
		rel, _ := filepath.Rel(dst, p)
		if d.Type()&fs.ModeSymlink != 0 {
			l, _ := os.Readlink(p)
			got[rel] = "-> " + l
		} else if d.Type().IsRegular() {
			b, _ := os.ReadFile(p)
			fi, _ := d.Info()
			got[rel] = string(b) + " " + fi.Mode().Perm().String()
		} else if !d.IsDir() {
			got[rel] = d.Type().String()
		}
		return nil
	})
	want := map[string]string{"a.txt": "a -rw-r--r--", "sub/b.txt": "b -rw-r-----", "in-link": "-> a.txt", "sub-link": "-> sub"}
	if len(got) != len(want) {
		t.Fatalf("copied %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("%s: %q, want %q (all: %v)", k, got[k], v, got)
		}
	}
	if res.Files != 2 || res.Dirs != 1 || res.Links != 2 || res.SkippedCount < 3 {
		t.Fatalf("result %+v", res)
	}
	// Bounds.
	for _, o := range []Options{{MaxEntries: 3}, {MaxBytes: 1}, {MaxDepth: 1}} {
		if _, err := Copy(root, filepath.Join(t.TempDir(), "c"), o); !errors.Is(err, ErrTooLarge) {
			t.Fatalf("%+v: %v, want ErrTooLarge", o, err)
		}
	}
	// Writable: a read-only release becomes a writable draft.
	ro := t.TempDir()
	must(t, os.WriteFile(filepath.Join(ro, "f"), []byte("x"), 0o444))
	must(t, os.Mkdir(filepath.Join(ro, "d"), 0o755))
	must(t, os.Chmod(filepath.Join(ro, "d"), 0o555))
	w := filepath.Join(t.TempDir(), "w")
	_, err = Copy(ro, w, Options{Writable: true})
	must(t, err)
	if fi, _ := os.Stat(filepath.Join(w, "f")); fi.Mode().Perm() != 0o644 {
		t.Fatalf("f is %v", fi.Mode())
	}
	if fi, _ := os.Stat(filepath.Join(w, "d")); fi.Mode().Perm() != 0o755 {
		t.Fatalf("d is %v", fi.Mode())
	}
}

func TestExcludeByInode(t *testing.T) {
	root := t.TempDir()
	must(t, os.MkdirAll(filepath.Join(root, "data", "x"), 0o755))
	must(t, os.WriteFile(filepath.Join(root, "data", "x", "db"), []byte("db"), 0o600))
	must(t, os.WriteFile(filepath.Join(root, "keep"), []byte("k"), 0o600))
	// Named through a link: the same directory all the same.
	alias := filepath.Join(t.TempDir(), "alias")
	must(t, os.Symlink(filepath.Join(root, "data"), alias))
	dst := filepath.Join(t.TempDir(), "c")
	_, err := Copy(root, dst, Options{Exclude: []string{alias}})
	must(t, err)
	if _, err := os.Lstat(filepath.Join(dst, "data")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("data copied: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(dst, "keep")); err != nil {
		t.Fatal(err)
	}
}

func TestWalk(t *testing.T) {
	root, _ := tree(t)
	r, err := Open(root)
	must(t, err)
	defer r.Close()
	types := map[string]fs.FileMode{}
	must(t, r.Walk(func(e *Entry) error {
		types[e.Path] = e.Type
		if e.Type.IsRegular() {
			f, err := e.Open()
			if e.Path == "hard" {
				if !errors.Is(err, ErrHardLink) {
					t.Errorf("hard: %v", err)
				}
				return nil
			}
			must(t, err)
			f.Close()
		}
		return nil
	}))
	if types["out-dir"] != fs.ModeSymlink || types["sub"] != fs.ModeDir || types["fifo"] != fs.ModeNamedPipe {
		t.Fatalf("types %v", types)
	}
	if _, ok := types["out-dir/token"]; ok {
		t.Fatal("walked into a link")
	}
}

func TestInside(t *testing.T) {
	for _, c := range []struct {
		dir, target string
		want        bool
	}{
		{".", "a", true}, {".", "sub/../a", true}, {"sub", "../a", true},
		{".", "../a", false}, {"sub", "../../a", false}, {".", "/etc/passwd", false}, {".", "", false},
	} {
		if got := Inside(c.dir, c.target); got != c.want {
			t.Errorf("Inside(%q, %q) = %v", c.dir, c.target, got)
		}
	}
}

func TestReplaceFile(t *testing.T) {
	root, secretDir := tree(t)
	modes(t, root, func(t *testing.T, r *Root) {
		must(t, r.ReplaceFile("sub/b.txt", []byte("new"), 0o600))
		if b, _ := os.ReadFile(filepath.Join(root, "sub", "b.txt")); string(b) != "new" {
			t.Fatalf("b.txt: %q", b)
		}
		// Through a link to a directory outside: refused.
		if err := r.ReplaceFile("out-dir/token", []byte("x"), 0o600); !errors.Is(err, ErrLink) {
			t.Fatalf("through a link: %v", err)
		}
		// A link at the name is replaced, its target untouched.
		must(t, r.ReplaceFile("out-link", []byte("x"), 0o600))
		if b, _ := os.ReadFile(filepath.Join(secretDir, "token")); string(b) != "secret" {
			t.Fatalf("the link's target was written: %q", b)
		}
		if _, err := os.Lstat(filepath.Join(root, "out-link")); err != nil {
			t.Fatal(err)
		}
		if err := r.ReplaceFile("../x", nil, 0o600); !errors.Is(err, ErrBadPath) {
			t.Fatalf("..: %v", err)
		}
	})
}
