package behavior

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func writeTree(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for p, c := range files {
		full := filepath.Join(dir, p)
		os.MkdirAll(filepath.Dir(full), 0o755)
		if err := os.WriteFile(full, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func baseTree() map[string]string {
	return map[string]string{
		"soul.md":                   "# soul\n",
		"instructions.md":           "be kind\n",
		"settings.toml":             "[attention]\nambient_defer_seconds = 8\n",
		"klbr_hooks/__init__.py":    "SLOTS = {}\n",
		"skills/workspace/SKILL.md": "\n# workspace\nhow to use it\n",
		"klbr_skills/__init__.py":   "",
		"embed.go":                  "package behavior // not behavior content",
	}
}

func TestPublishIsContentAddressedImmutableAndVerified(t *testing.T) {
	r, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	src := writeTree(t, baseTree())
	m, err := r.Publish(os.DirFS(src))
	if err != nil {
		t.Fatal(err)
	}
	if len(m.ID) != 64 || len(m.Files) != 6 || strings.Join(m.Skills, ",") != "workspace" {
		t.Fatalf("manifest: %+v", m)
	}
	for _, f := range m.Files {
		if f.Path == "embed.go" {
			t.Fatal("a Go file was published")
		}
	}
	again, err := r.Publish(os.DirFS(src))
	if err != nil || again.ID != m.ID {
		t.Fatalf("republish: %s %v", again.ID, err)
	}
	if _, err := r.Verify(m.ID); err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(filepath.Join(r.Tree(m.ID), "soul.md"))
	if fi.Mode().Perm()&0o222 != 0 {
		t.Errorf("release file is writable: %v", fi.Mode())
	}
	if err := os.WriteFile(filepath.Join(r.Tree(m.ID), "soul.md"), []byte("x"), 0o644); err == nil && os.Getuid() != 0 {
		t.Error("wrote into a release")
	}
	// Corruption on disk is detected.
	p := filepath.Join(r.Tree(m.ID), "instructions.md")
	os.Chmod(filepath.Dir(p), 0o755)
	os.Chmod(p, 0o644)
	os.WriteFile(p, []byte("be unkind\n"), 0o644)
	if _, err := r.Verify(m.ID); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Verify of a corrupted release: %v", err)
	}
	// Publishing the same content again repairs it.
	if _, err := r.Publish(os.DirFS(src)); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Verify(m.ID); err != nil {
		t.Fatalf("after republish: %v", err)
	}
	if id, err := r.Resolve(r.Dir(m.ID)); err != nil || id != m.ID {
		t.Fatalf("Resolve(path) = %s %v", id, err)
	}
	if _, err := r.Resolve("/etc/../etc"); err == nil {
		t.Fatal("Resolve accepted a foreign path")
	}
}

func TestBadTreesAreRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(dir string)
		want string
	}{
		{"symlink", func(d string) { os.Symlink("/etc/passwd", filepath.Join(d, "klbr_hooks", "x.py")) }, "symlink"},
		{"bytecode", func(d string) {
			os.MkdirAll(filepath.Join(d, "klbr_hooks", "__pycache__"), 0o755)
			os.WriteFile(filepath.Join(d, "klbr_hooks", "__pycache__", "a.cpython-311.pyc"), []byte("x"), 0o644)
		}, "bytecode"},
		{"oversized file", func(d string) { os.WriteFile(filepath.Join(d, "big.md"), make([]byte, MaxFileBytes+1), 0o644) }, "at most"},
		{"skill heading", func(d string) {
			os.WriteFile(filepath.Join(d, "skills", "workspace", "SKILL.md"), []byte("# other\n"), 0o644)
		}, `must start with the line "# workspace"`},
		{"skill id", func(d string) {
			os.MkdirAll(filepath.Join(d, "skills", "Bad Id"), 0o755)
			os.WriteFile(filepath.Join(d, "skills", "Bad Id", "SKILL.md"), []byte("# Bad Id\n"), 0o644)
		}, "not an allowed file name"},
		{"dot-dot name", func(d string) { os.WriteFile(filepath.Join(d, "a..b.md"), []byte("x"), 0o644) }, "not an allowed file name"},
		{"profile unknown key", func(d string) {
			os.MkdirAll(filepath.Join(d, "profiles"), 0o755)
			os.WriteFile(filepath.Join(d, "profiles", "review.toml"), []byte("description = \"r\"\nmodel = \"big\"\n"), 0o644)
		}, "profiles/review.toml: invalid profile: unknown key model"},
		{"profile bad budget", func(d string) {
			os.MkdirAll(filepath.Join(d, "profiles"), 0o755)
			os.WriteFile(filepath.Join(d, "profiles", "review.toml"), []byte("description = \"r\"\n[budget]\ntokens = 0\n"), 0o644)
		}, "profiles/review.toml: invalid profile: [budget] tokens = 0"},
		{"profile name", func(d string) {
			os.MkdirAll(filepath.Join(d, "profiles"), 0o755)
			os.WriteFile(filepath.Join(d, "profiles", "Review.toml"), []byte("description = \"r\"\n"), 0o644)
		}, "profiles/Review.toml: invalid profile: \"Review\" is not a profile name"},
		{"profile not toml", func(d string) {
			os.MkdirAll(filepath.Join(d, "profiles"), 0o755)
			os.WriteFile(filepath.Join(d, "profiles", "notes.md"), []byte("x"), 0o644)
		}, "profiles/ holds only <name>.toml files"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := writeTree(t, baseTree())
			tc.edit(src)
			r, _ := Open(t.TempDir())
			_, err := r.Publish(os.DirFS(src))
			if !errors.Is(err, ErrInvalidTree) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Publish: %v, want %q", err, tc.want)
			}
			if ids, _ := r.List(); len(ids) != 0 {
				t.Fatalf("a refused tree left a release: %v", ids)
			}
		})
	}
}

func TestActivationKind(t *testing.T) {
	base := baseTree()
	scan := func(edit func(map[string]string)) Components {
		files := map[string]string{}
		for k, v := range base {
			files[k] = v
		}
		edit(files)
		m, _, err := Scan(os.DirFS(writeTree(t, files)))
		if err != nil {
			t.Fatal(err)
		}
		return m.Components
	}
	orig := scan(func(map[string]string) {})
	for _, tc := range []struct {
		name string
		edit func(map[string]string)
		want Kind
	}{
		{"same", func(map[string]string) {}, KindNone},
		{"soul", func(f map[string]string) { f["soul.md"] = "# a new soul\n" }, KindPrompt},
		{"hook", func(f map[string]string) { f["klbr_hooks/__init__.py"] = "SLOTS = {'x': 1}\n" }, KindHooks},
		{"hook and soul", func(f map[string]string) { f["klbr_hooks/__init__.py"] = "X=1\n"; f["soul.md"] = "s\n" }, KindHooks},
		{"skill", func(f map[string]string) { f["skills/workspace/SKILL.md"] = "# workspace\nmore\n" }, KindWorkbench},
		{"settings", func(f map[string]string) { f["settings.toml"] = "" }, KindHooks},
		{"environment", func(f map[string]string) { f["requirements.txt"] = "numpy\n" }, KindWorkbench},
		{"profile", func(f map[string]string) { f["profiles/review.toml"] = "description = \"reviews\"\n" }, KindPrompt},
	} {
		if got := ActivationKind(orig, scan(tc.edit)); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}
}

// A release id may be shortened to a unique prefix of 6 or more hex digits; an
// ambiguous prefix is refused naming the releases it could mean.
func TestResolveUniquePrefix(t *testing.T) {
	dir := t.TempDir()
	r, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	a := "abcdef01" + strings.Repeat("0", 56)
	b := "abcdef02" + strings.Repeat("0", 56)
	c := "123456" + strings.Repeat("f", 58)
	for _, id := range []string{a, b, c} {
		if err := os.Mkdir(filepath.Join(dir, id), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct{ ref, want, err string }{
		{ref: "abcdef01", want: a},
		{ref: "123456", want: c},
		{ref: c, want: c},
		{ref: "abcdef", err: "abcdef01" + strings.Repeat("0", 4)},
		{ref: "abcde", err: "at least 6 hex digits"},
		{ref: "fedcba", err: "no stored release starts with"},
		{ref: "ABCDEF01", err: "neither"},
	} {
		got, err := r.Resolve(tc.ref)
		switch {
		case tc.err == "" && (err != nil || got != tc.want):
			t.Errorf("Resolve(%s) = %s, %v; want %s", tc.ref, got, err, tc.want)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("Resolve(%s) = %s, %v; want an error with %q", tc.ref, got, err, tc.err)
		}
	}
	if _, err := r.Resolve("abcdef"); err == nil || !strings.Contains(err.Error(), b[:12]) || !strings.Contains(err.Error(), a[:12]) {
		t.Errorf("an ambiguous prefix must list both candidates: %v", err)
	}
}
