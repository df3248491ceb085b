package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// With no route configured, the seed's defaults are in force and marked as
// such: agent.route at :8001, falling back to :8002 and :8003, carrying no
// model name; a file that defines a route gets none of them.
func TestSeedRoutesWhenNoneConfigured(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "klbr.toml")
	cfg, err := Load(envMap(map[string]string{"HOME": dir, "KLBR_DATA_DIR": dir}))
	if err != nil {
		t.Fatal(err)
	}
	f := cfg.File
	if !f.SeedRoutes || f.Agent.Route != "main" || strings.Join(f.StepRoutes(), " ") != "main seed-8002 seed-8003" {
		t.Fatalf("no file: seed %v, plan %v", f.SeedRoutes, f.StepRoutes())
	}
	for name, url := range map[string]string{"main": "http://localhost:8001/v1", "seed-8002": "http://localhost:8002/v1", "seed-8003": "http://localhost:8003/v1"} {
		r := f.Routes[name]
		if r.URL != url || r.Model != "" || r.TimeoutSeconds != DefaultRouteTimeoutSeconds || !strings.Contains(r.Seed, "[routes.main]") {
			t.Errorf("%s = %+v", name, r)
		}
	}
	if s := f.SeedNote(cfg.Paths.ConfigFile); !strings.Contains(s, "no route configured: using seed defaults http://localhost:8001/v1") ||
		!strings.Contains(s, cfg.Paths.ConfigFile) {
		t.Errorf("note %q", s)
	}

	os.WriteFile(conf, []byte("[agent]\nroute = \"work\"\nretry_backoff_ms = 50\n"), 0o600)
	cfg, err = Load(envMap(map[string]string{"HOME": dir, "KLBR_DATA_DIR": dir, "KLBR_CONFIG": conf}))
	if err != nil || !cfg.File.SeedRoutes || cfg.File.Routes["work"].URL != "http://localhost:8001/v1" {
		t.Fatalf("agent.route work: %v %+v", err, cfg.File.Routes)
	}
	os.WriteFile(conf, []byte("[routes.main]\nurl = \"http://x/v1\"\nmodel = \"m\"\n"), 0o600)
	next, err := cfg.Reread()
	if err != nil || next.File.SeedRoutes || len(next.File.Routes) != 1 || len(next.File.Agent.Fallback) != 0 {
		t.Fatalf("a configured route: %v seed %v %+v", err, next.File.SeedRoutes, next.File.Routes)
	}
	os.WriteFile(conf, []byte("[agent]\nretry_backoff_ms = 50\n"), 0o600)
	if next, err = cfg.Reread(); err != nil || !next.File.SeedRoutes {
		t.Fatalf("reread without a route: %v seed %v", err, next.File.SeedRoutes)
	}
}
