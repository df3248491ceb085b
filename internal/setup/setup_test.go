package setup

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klbr-dev/klbr/internal/config"
)

// The commented klbr.toml is written once, never over an operator's file;
// the template parses to the defaults, and uncommented it runs the agent.
func TestInitWritesTheConfigTemplateOnce(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "klbr.toml")
	if created, err := WriteConfigTemplate(path); err != nil || !created {
		t.Fatalf("first write: %v %v", created, err)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("template: %v %v", fi, err)
	}
	if f, err := config.Parse("klbr.toml", []byte(ConfigTemplate)); err != nil || f.Agent.Route != config.DefaultAgentRoute || len(f.Routes) != 0 {
		t.Fatalf("the template as written: %+v %v", f, err)
	}
	var uncommented []string
	for _, line := range strings.Split(ConfigTemplate, "\n") {
		if l, ok := strings.CutPrefix(line, "# "); ok && (strings.HasPrefix(l, "[") || strings.Contains(l, " = ")) {
			line = l
		}
		uncommented = append(uncommented, line)
	}
	f, err := config.Parse("klbr.toml", []byte(strings.Join(uncommented, "\n")))
	if err != nil {
		t.Fatalf("the template uncommented: %v", err)
	}
	if r, ok := f.AgentRoute(); !ok || r.Model != "local" {
		t.Fatalf("the template's route: %+v %v", r, ok)
	}

	if err := os.WriteFile(path, []byte("[agent]\nroute = \"mine\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if created, err := WriteConfigTemplate(path); err != nil || created {
		t.Fatalf("second write: %v %v", created, err)
	}
	if b, _ := os.ReadFile(path); string(b) != "[agent]\nroute = \"mine\"\n" {
		t.Fatalf("init overwrote the operator's file: %q", b)
	}
}
