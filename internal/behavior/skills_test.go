package behavior

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLoadSkillsRefusesDuplicatesAndBadHeadings(t *testing.T) {
	builtin, managed := t.TempDir(), t.TempDir()
	write := func(root, id, body string) {
		os.MkdirAll(filepath.Join(root, id), 0o755)
		os.WriteFile(filepath.Join(root, id, "SKILL.md"), []byte(body), 0o644)
	}
	write(builtin, "workspace", "# workspace\nuse the helpers\n")
	write(builtin, "shared", "# shared\nbuiltin\n")
	write(managed, "shared", "# shared\nmanaged\n")
	write(managed, "mine", "\n\n# mine\nwritten by the agent\n")
	write(managed, "wrong", "# right\n")
	set, err := LoadSkills([]SkillRoot{{Name: "builtin", Dir: builtin}, {Name: "managed", Dir: managed}, {Name: "missing", Dir: filepath.Join(managed, "nope")}})
	if err != nil {
		t.Fatal(err)
	}
	if len(set.Skills) != 2 || set.Skills["workspace"] == "" || set.Skills["mine"] == "" {
		t.Fatalf("offered: %v", set.Skills)
	}
	if set.Refused["shared"] != "defined in both builtin and managed" || set.Refused["wrong"] == "" {
		t.Fatalf("refused: %v", set.Refused)
	}
	again, _ := LoadSkills([]SkillRoot{{Name: "builtin", Dir: builtin}, {Name: "managed", Dir: managed}})
	if again.Revision != set.Revision || len(set.Revision) != 64 {
		t.Fatalf("revision not stable: %s %s", set.Revision, again.Revision)
	}
	write(managed, "mine", "# mine\nedited\n")
	if edited, _ := LoadSkills([]SkillRoot{{Name: "builtin", Dir: builtin}, {Name: "managed", Dir: managed}}); edited.Revision == set.Revision {
		t.Fatal("revision did not change with a body")
	}
}

func TestIndexIsBounded(t *testing.T) {
	set := SkillSet{Skills: map[string]string{}, Modules: map[string]string{"checks": "Run checks."}, Refused: map[string]string{"bad": "x"}}
	set.Skills["workspace"] = "# workspace\n\nHow to edit the checkout.\nmore\n"
	idx := set.Index()
	for _, want := range []string{"- workspace: How to edit the checkout.", "- klbr_skills.checks: Run checks.", "Refused (skills.refused says why): bad"} {
		if !strings.Contains(idx, want) {
			t.Errorf("index lacks %q:\n%s", want, idx)
		}
	}
	for i := 0; i < 200; i++ {
		set.Skills[fmt.Sprintf("s%03d", i)] = "# s\n" + strings.Repeat("long line ", 30)
	}
	idx = set.Index()
	if len(idx) > IndexMaxBytes || !strings.Contains(idx, "more not listed") {
		t.Fatalf("index of %d bytes, unbounded or uncounted:\n%s", len(idx), idx[len(idx)-200:])
	}
}

// A skills directory a cell can write (managed, or the operator's
// KLBR_SKILLS_DIR inside the workspace) is read with no link followed: a
// linked skill directory is not offered, a linked or hard-linked SKILL.md or
// __init__.py is refused, never read through.
func TestLoadSkillsFollowsNoLink(t *testing.T) {
	dir, outside := t.TempDir(), t.TempDir()
	write := func(root, rel, body string) {
		t.Helper()
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(outside, "linked/SKILL.md", "# linked\nfrom outside\n")
	write(outside, "secret.md", "# hard\nthe host's secret\n")
	write(outside, "inner.md", "# inner\nfrom outside\n")
	write(outside, "mod.py", "SECRET = 1\n")
	write(dir, "plain/SKILL.md", "# plain\nfine\n")
	write(dir, "inner/.keep", "")
	write(dir, "hard/.keep", "")
	write(dir, "mod/SKILL.md", "# mod\nwith code\n")
	if err := os.Symlink(filepath.Join(outside, "linked"), filepath.Join(dir, "linked")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(outside, "inner.md"), filepath.Join(dir, "inner", "SKILL.md")); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(filepath.Join(outside, "secret.md"), filepath.Join(dir, "hard", "SKILL.md")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(outside, "mod.py"), filepath.Join(dir, "mod", "__init__.py")); err != nil {
		t.Fatal(err)
	}
	set, err := LoadSkills([]SkillRoot{{Name: "KLBR_SKILLS_DIR", Dir: dir}})
	if err != nil {
		t.Fatal(err)
	}
	if len(set.Skills) != 2 || set.Skills["plain"] == "" || set.Skills["mod"] == "" {
		t.Fatalf("offered: %v", set.Skills)
	}
	for _, id := range []string{"inner", "hard"} {
		if set.Refused[id] == "" {
			t.Errorf("%s not refused: %v", id, set.Refused)
		}
	}
	if len(set.Modules) != 0 {
		t.Fatalf("a linked __init__.py made a module: %v", set.Modules)
	}
	for id, body := range set.Skills {
		if strings.Contains(body, "outside") || strings.Contains(body, "secret") {
			t.Fatalf("%s read through a link: %q", id, body)
		}
	}
}
