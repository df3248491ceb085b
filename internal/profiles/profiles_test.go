package profiles

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const full = `description = "reviews a change"
instructions = """
Read the diff. Report problems, not style."""
route = "cheap"
fallback = ["main"]
delegate = ["local.send"]
workspace = "read_only"

[budget]
tokens = 200000
wall_seconds = 600
model_requests = 40
usd = 0.5
`

func TestParseFull(t *testing.T) {
	p, err := Parse("code-review", []byte(full))
	if err != nil {
		t.Fatal(err)
	}
	if p.Name != "code-review" || p.Description != "reviews a change" || !strings.HasPrefix(p.Instructions, "Read the diff.") ||
		!slices.Equal(p.Routes(), []string{"cheap", "main"}) || !slices.Equal(p.Delegate, []string{"local.send"}) || p.Workspace != "read_only" {
		t.Fatalf("%+v", p)
	}
	if *p.Budget.Tokens != 200000 || *p.Budget.WallSeconds != 600 || *p.Budget.ModelRequests != 40 || p.Budget.USD == nil || *p.Budget.USD != 0.5 {
		t.Fatalf("budget %+v", p.Budget)
	}
	p, err = Parse("plain", []byte(`description = "x"`))
	if err != nil || p.Routes() != nil || !p.Budget.IsZero() {
		t.Fatalf("%+v, %v", p, err)
	}
}

func TestParseRefusals(t *testing.T) {
	for _, tc := range []struct{ name, file, want string }{
		{"ok", "route = \"r\"", "description is empty"},
		{"ok", "description = \"d\"\nmodel = \"m\"", "unknown key model"},
		{"ok", "description = \"d\"\n[budget]\ncost = 3", "unknown key budget.cost"},
		{"ok", "description = \"d\"\n[budget]\ntokens = -1", "[budget] tokens = -1"},
		{"ok", "description = \"d\"\n[budget]\ntokens = 1.5", "line 3"},
		{"ok", "description = \"d\"\n[budget]\nwall_seconds = 0", "[budget] wall_seconds = 0"},
		{"ok", "description = \"d\"\n[budget]\nwall_seconds = inf", "wall_seconds = +Inf"},
		{"ok", "description = \"d\"\n[budget]\nwall_seconds = nan", "wall_seconds = NaN"},
		{"ok", "description = \"d\"\n[budget]\nmodel_requests = 0", "model_requests = 0"},
		{"ok", "description = \"d\"\n[budget]\nusd = -1", "[budget] usd = -1"},
		{"ok", "description = \"d\"\nfallback = [\"x\"]", "fallback without route"},
		{"ok", "description = \"d\"\nroute = \"a\"\nfallback = [\"a\"]", `route "a" is named twice`},
		{"ok", "description = \"d\"\nroute = \"a b\"", `"a b" is not a route name`},
		{"ok", "description = \"d\"\ndelegate = [\"shell.run\"]", `"shell.run" cannot be delegated`},
		{"ok", "description = \"d\"\nworkspace = \"home\"", `workspace "home" is none of`},
		{"ok", "description = \"d\"\ndescription = \"e\"", "line 2"},
		{"ok", "description = ", "line 1"},
		{"Bad", "description = \"d\"", `"Bad" is not a profile name`},
		{"ok", "description = \"" + strings.Repeat("x", MaxDescriptionBytes+1) + "\"", "description is"},
		{"ok", "description = \"d\"\ninstructions = \"" + strings.Repeat("x", MaxInstructionBytes+1) + "\"", "instructions are"},
		{"ok", strings.Repeat("#", MaxFileBytes+1), "at most"},
		{"ok", "description = \"\xff\"", "not UTF-8"},
		{"ok", "description = \"d\"\nhost = \"a b\"", `host "a b" is not`},
		{"ok", "description = \"d\"\nhost = \"gpu\"\nworkspace = \"shared\"", `workspace "shared" with host`},
	} {
		_, err := Parse(tc.name, []byte(tc.file))
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.file, err, tc.want)
		}
	}
}

func TestLoadAndNames(t *testing.T) {
	tree := t.TempDir()
	if _, err := Load(tree, "review"); !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "it has none") {
		t.Fatalf("Load without profiles/: %v", err)
	}
	os.MkdirAll(filepath.Join(tree, Dir), 0o755)
	os.WriteFile(filepath.Join(tree, Dir, "b.toml"), []byte(`description = "b"`), 0o644)
	os.WriteFile(filepath.Join(tree, Dir, "a.toml"), []byte(`description = "a"`), 0o644)
	if _, err := Load(tree, "review"); !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), `"review" in the release (it has a, b)`) {
		t.Fatalf("Load of a missing profile: %v", err)
	}
	if _, err := Load(tree, "../b"); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Load of a path: %v", err)
	}
	ps, err := List(tree)
	if err != nil || len(ps) != 2 || ps[0].Name != "a" || ps[1].Description != "b" {
		t.Fatalf("List: %+v, %v", ps, err)
	}
}

func TestCheckFiles(t *testing.T) {
	names, err := CheckFiles(map[string][]byte{"soul.md": nil, "profiles/a.toml": []byte(`description = "a"`)})
	if err != nil || !slices.Equal(names, []string{"a"}) {
		t.Fatalf("%v, %v", names, err)
	}
	for _, files := range []map[string][]byte{
		{"profiles/a.toml": []byte(`x = 1`)},
		{"profiles/sub/a.toml": []byte(`description = "a"`)},
		{"profiles/a.txt": []byte(`description = "a"`)},
	} {
		if _, err := CheckFiles(files); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "profiles/") {
			t.Errorf("%v: %v", files, err)
		}
	}
}

// The shipped tree's profiles parse.
func TestShippedProfiles(t *testing.T) {
	ps, err := List("../../behavior")
	if err != nil || len(ps) == 0 {
		t.Fatalf("%+v, %v", ps, err)
	}
	fps, err := ListFS(os.DirFS("../../behavior"))
	if err != nil || len(fps) != len(ps) || fps[0].Name != ps[0].Name || fps[0].Instructions != ps[0].Instructions {
		t.Fatalf("ListFS: %+v, %v", fps, err)
	}
	for _, p := range ps {
		if p.Route != "" {
			t.Errorf("shipped profile %s names route %q: it would not work on every install", p.Name, p.Route)
		}
	}
}

// Parse of any bytes never panics, and what it accepts is within bounds.
func FuzzParse(f *testing.F) {
	f.Add("code-review", []byte(full))
	f.Add("x", []byte("description = \"d\"\n[budget]\ntokens = 1"))
	f.Fuzz(func(t *testing.T, name string, b []byte) {
		p, err := Parse(name, b)
		if err != nil {
			return
		}
		if !NamePattern.MatchString(p.Name) || p.Description == "" || len(p.Instructions) > MaxInstructionBytes || len(p.Routes()) > MaxFallback+1 {
			t.Fatalf("accepted %+v", p)
		}
		for _, d := range p.Delegate {
			if !slices.Contains(Delegable, d) {
				t.Fatalf("accepted delegate %q", d)
			}
		}
		if err := p.Budget.Check(""); err != nil {
			t.Fatalf("accepted budget %s: %v", p.Budget.JSON(), err)
		}
	})
}

// BenchmarkLoad is what a spawn with a profile adds before its
// transaction: the profile file read and parsed.
func BenchmarkLoad(b *testing.B) {
	tree := b.TempDir()
	os.MkdirAll(filepath.Join(tree, Dir), 0o755)
	os.WriteFile(filepath.Join(tree, Dir, "code-review.toml"), []byte(full), 0o644)
	for range b.N {
		if _, err := Load(tree, "code-review"); err != nil {
			b.Fatal(err)
		}
	}
}
