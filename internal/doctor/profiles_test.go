package doctor

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// doctor lists the default tree's profiles and warns of one whose route
// klbr.toml does not configure; a profile that does not parse fails.
func TestDoctorChecksProfiles(t *testing.T) {
	tree := t.TempDir()
	if err := os.CopyFS(tree, os.DirFS("../../behavior")); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(tree, "profiles", "far.toml"), []byte("description = \"far\"\nroute = \"nowhere\"\n"), 0o644)
	env := map[string]string{"HOME": t.TempDir(), "KLBR_DATA_DIR": t.TempDir(), "KLBR_BEHAVIOR_DIR": tree}
	checks := func() map[string]Check {
		out := map[string]Check{}
		for _, c := range Run(context.Background(), func(k string) (string, bool) { v, ok := env[k]; return v, ok }, Options{}).Checks {
			out[c.Name] = c
		}
		return out
	}
	cs := checks()
	if c := cs["profiles"]; !c.OK || !strings.Contains(c.Detail, "code-review (the agent's routes)") || !strings.Contains(c.Detail, "far (route nowhere)") {
		t.Fatalf("profiles: %+v", c)
	}
	if c := cs["profile far"]; !c.Warn || !strings.Contains(c.Detail, `names route "nowhere"`) || !strings.Contains(c.Fix, "[routes.nowhere]") {
		t.Fatalf("profile far: %+v", c)
	}
	os.WriteFile(filepath.Join(tree, "profiles", "far.toml"), []byte("description = \"far\"\ncolour = \"red\"\n"), 0o644)
	if c := checks()["profiles"]; c.OK || !strings.Contains(c.Detail, "profiles/far.toml") || !strings.Contains(c.Detail, "unknown key colour") {
		t.Fatalf("a bad profile: %+v", c)
	}
}
