package behavior

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestSkillModulesOneNamespace(t *testing.T) {
	tree, managed := t.TempDir(), t.TempDir()
	write := func(p, body string) {
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(tree, "skills", "checks", "SKILL.md"), "# checks\nrun them\n")
	write(filepath.Join(tree, "klbr_skills", "__init__.py"), `"""helpers"""`+"\n")
	write(filepath.Join(tree, "klbr_skills", "checks.py"), `"""Run the project's checks.

more"""
def run(): return 1
`)
	write(filepath.Join(tree, "klbr_skills", "both.py"), "x = 1\n")
	write(filepath.Join(tree, "klbr_skills", "pkg", "__init__.py"), "# c\n'''A package.'''\n")
	write(filepath.Join(managed, "mine", "SKILL.md"), "# mine\nmine\n")
	write(filepath.Join(managed, "mine", "__init__.py"), `"""Mine."""`+"\nfrom .helper import f\n")
	write(filepath.Join(managed, "mine", "helper.py"), "def f(): return 2\n")
	write(filepath.Join(managed, "both", "SKILL.md"), "# both\n")
	write(filepath.Join(managed, "both", "__init__.py"), "y = 2\n")
	write(filepath.Join(managed, "code-review", "SKILL.md"), "# code-review\n")
	write(filepath.Join(managed, "code-review", "__init__.py"), "")
	write(filepath.Join(managed, "textonly", "SKILL.md"), "# textonly\n")
	roots := []SkillRoot{
		{Name: "builtin", Dir: filepath.Join(tree, "skills"), Package: filepath.Join(tree, "klbr_skills")},
		{Name: "managed", Dir: managed},
	}
	set, err := LoadSkills(roots)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"checks": "Run the project's checks.", "pkg": "A package.", "mine": "Mine."}
	if len(set.Modules) != len(want) {
		t.Fatalf("modules %v, want %v", set.Modules, want)
	}
	for k, v := range want {
		if set.Modules[k] != v {
			t.Errorf("module %s: %q, want %q", k, set.Modules[k], v)
		}
	}
	if !strings.Contains(set.Refused["both"], "defined in both builtin and managed") || !strings.Contains(set.Refused["code-review"], "not a Python identifier") {
		t.Fatalf("refused: %v", set.Refused)
	}
	if set.Skills["code-review"] == "" || set.Skills["textonly"] == "" {
		t.Fatalf("text skills lost: %v", set.Skills)
	}
	dir := t.TempDir()
	path, err := Stage(set, dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"__init__.py", "checks.py", "pkg/__init__.py", "mine/__init__.py", "mine/helper.py"} {
		if _, err := os.Stat(filepath.Join(path, "klbr_skills", p)); err != nil {
			t.Errorf("staged package lacks %s: %v", p, err)
		}
	}
	for _, p := range []string{"both.py", "both/__init__.py"} {
		if _, err := os.Stat(filepath.Join(path, "klbr_skills", p)); err == nil {
			t.Errorf("the refused module %s was staged", p)
		}
	}
	if again, err := Stage(set, dir); err != nil || again != path {
		t.Fatalf("restage: %q %v", again, err)
	}
	// A managed module edited later is a new revision; a running generation keeps its copy.
	write(filepath.Join(managed, "mine", "helper.py"), "def f(): return 3\n")
	edited, _ := LoadSkills(roots)
	if edited.Revision == set.Revision {
		t.Fatal("revision did not change with a module")
	}
	if b, _ := os.ReadFile(filepath.Join(path, "klbr_skills", "mine", "helper.py")); !strings.Contains(string(b), "return 2") {
		t.Fatal("the staged copy changed")
	}
	t.Cleanup(func() { makeWritable(dir) })
}

func TestDocLine(t *testing.T) {
	for src, want := range map[string]string{
		"":        "",
		"x = 1\n": "",
		"#!/usr/bin/env python\n\"\"\"\n  First.\n\"\"\"": "First.",
		"r'''Raw.'''": "Raw.",
		"\"one\"\n":   "one",
	} {
		if got := DocLine([]byte(src)); got != want {
			t.Errorf("DocLine(%q) = %q, want %q", src, got, want)
		}
	}
}
