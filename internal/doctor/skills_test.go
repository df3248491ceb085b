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
