package behavior

import (
	"os"
	"path/filepath"
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
	set, err := LoadSkills([]SkillRoot{{"builtin", builtin}, {"managed", managed}, {"missing", filepath.Join(managed, "nope")}})
	if err != nil {
		t.Fatal(err)
	}
	if len(set.Skills) != 2 || set.Skills["workspace"] == "" || set.Skills["mine"] == "" {
		t.Fatalf("offered: %v", set.Skills)
	}
	if set.Refused["shared"] != "defined in both builtin and managed" || set.Refused["wrong"] == "" {
		t.Fatalf("refused: %v", set.Refused)
	}
	again, _ := LoadSkills([]SkillRoot{{"builtin", builtin}, {"managed", managed}})
	if again.Revision != set.Revision || len(set.Revision) != 64 {
		t.Fatalf("revision not stable: %s %s", set.Revision, again.Revision)
	}
	write(managed, "mine", "# mine\nedited\n")
	if edited, _ := LoadSkills([]SkillRoot{{"builtin", builtin}, {"managed", managed}}); edited.Revision == set.Revision {
		t.Fatal("revision did not change with a body")
	}
}
