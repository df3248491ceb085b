package doctor

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// doctor lists the offered ids and modules and every refusal with its reason.
func TestDoctorListsSkillsAndRefusals(t *testing.T) {
	data := t.TempDir()
	for id, body := range map[string]string{"workspace": "# workspace\nshadow\n", "mine": "# mine\nmy own\n"} {
		os.MkdirAll(filepath.Join(data, "skills", id), 0o755)
		os.WriteFile(filepath.Join(data, "skills", id, "SKILL.md"), []byte(body), 0o644)
	}
	os.WriteFile(filepath.Join(data, "skills", "mine", "__init__.py"), []byte(`"""Mine."""`+"\n"), 0o644)
	env := map[string]string{"HOME": t.TempDir(), "KLBR_DATA_DIR": data}
	r := Run(context.Background(), func(k string) (string, bool) { v, ok := env[k]; return v, ok }, Options{})
	var skills, refused string
	for _, c := range r.Checks {
		switch c.Name {
		case "skills":
			skills = c.Detail
		case "skill workspace":
			refused = c.Detail
		}
	}
	for _, want := range []string{"maintenance", "mine", "klbr_skills.mine", "1 refused"} {
		if !strings.Contains(skills, want) {
			t.Errorf("skills line lacks %q: %s", want, skills)
		}
	}
	if strings.Contains(skills, "workspace,") || !strings.Contains(refused, "defined in both builtin and managed") {
		t.Fatalf("the twice-defined id: skills %q, refusal %q", skills, refused)
	}
}

// With KLBR_SKILLS_DIR set, doctor names it, lists its ids with the others
// and refuses an id it shares with the managed skills, naming both; a
// linked skill there is not offered.
func TestDoctorListsSkillsDir(t *testing.T) {
	data, dir, outside := t.TempDir(), t.TempDir(), t.TempDir()
	write := func(root, id, body string) {
		os.MkdirAll(filepath.Join(root, id), 0o755)
		os.WriteFile(filepath.Join(root, id, "SKILL.md"), []byte(body), 0o644)
	}
	write(dir, "deploy", "# deploy\nfrom the operator's dir\n")
	write(dir, "twice", "# twice\nhere\n")
	write(data+"/skills", "twice", "# twice\nand there\n")
	write(outside, "planted", "# planted\nthrough a link\n")
	if err := os.Symlink(filepath.Join(outside, "planted"), filepath.Join(dir, "planted")); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"HOME": t.TempDir(), "KLBR_DATA_DIR": data, "KLBR_SKILLS_DIR": dir}
	r := Run(context.Background(), func(k string) (string, bool) { v, ok := env[k]; return v, ok }, Options{})
	var skills, refused string
	for _, c := range r.Checks {
		switch c.Name {
		case "skills":
			skills = c.Detail
		case "skill twice":
			refused = c.Detail
		}
	}
	for _, want := range []string{"KLBR_SKILLS_DIR " + dir, "deploy", "maintenance", "1 refused"} {
		if !strings.Contains(skills, want) {
			t.Errorf("skills line lacks %q: %s", want, skills)
		}
	}
	if strings.Contains(skills, "planted") || strings.Contains(skills, "twice,") {
		t.Errorf("offered what it must not: %s", skills)
	}
	if !strings.Contains(refused, "defined in both KLBR_SKILLS_DIR and managed") {
		t.Fatalf("refusal %q, want the id named with both sources", refused)
	}
}
