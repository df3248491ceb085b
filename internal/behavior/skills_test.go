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
