package doctor

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klbr-dev/klbr/internal/citest"
)

// A route nothing uses (not the agent's, a fallback, the summary route or
// a profile's) is a warning, whatever its server does; the agent's route
// that does not answer is a failure.
func TestDoctorWarnsOfAnUnusedRoute(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := l.Addr().String()
	l.Close() // nothing answers there now
	data := t.TempDir()
	conf := fmt.Sprintf("[agent]\nroute = \"main\"\n\n[routes.main]\nurl = \"http://%s/v1\"\nmodel = \"m\"\n\n[routes.old]\nurl = \"http://%s/v1\"\nmodel = \"m\"\n", gone, gone)
	if err := os.WriteFile(filepath.Join(data, "klbr.toml"), []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"HOME": t.TempDir(), "KLBR_DATA_DIR": data}
	r := Run(context.Background(), func(k string) (string, bool) { v, ok := env[k]; return v, ok }, Options{})
	var main, old *Check
	for i, c := range r.Checks {
		switch {
		case c.Name == "route" && strings.HasPrefix(c.Detail, "main"):
			main = &r.Checks[i]
		case c.Name == "route" && strings.HasPrefix(c.Detail, "old"):
			old = &r.Checks[i]
		}
	}
	if main == nil || old == nil {
		t.Fatalf("doctor checked routes %+v", r.Checks)
	}
	if main.OK {
		t.Errorf("the agent's route that does not answer passed: %+v", *main)
	}
	if !old.OK || !old.Warn || !strings.Contains(old.Detail, "nothing uses it") {
		t.Errorf("the unused route: %+v; want a warning that says nothing uses it", *old)
	}
}

// With no route configured, doctor names the seed defaults in force and,
// when nothing answers there, what to start or configure: warnings, as no
// route at all was (nobody chose these servers).
func TestDoctorNamesTheSeedDefaults(t *testing.T) {
	for _, port := range []string{"8001", "8002", "8003"} {
		if c, err := net.Dial("tcp", "localhost:"+port); err == nil {
			c.Close()
			citest.SkipOrFail(t, "something listens on localhost:"+port+" (a seed default): this test needs nothing there")
		}
	}
	data := t.TempDir()
	env := map[string]string{"HOME": t.TempDir(), "KLBR_DATA_DIR": data}
	r := Run(context.Background(), func(k string) (string, bool) { v, ok := env[k]; return v, ok }, Options{})
	conf := filepath.Join(data, "klbr.toml")
	var seed, main, fb *Check
	for i, c := range r.Checks {
		switch {
		case c.Name == "route" && strings.HasPrefix(c.Detail, "no route configured"):
			seed = &r.Checks[i]
		case c.Name == "route" && strings.HasPrefix(c.Detail, "main"):
			main = &r.Checks[i]
		case c.Name == "route" && strings.HasPrefix(c.Detail, "seed-8002"):
			fb = &r.Checks[i]
		}
	}
	if seed == nil || main == nil || fb == nil {
		t.Fatalf("doctor checked routes %+v", r.Checks)
	}
	if !strings.Contains(seed.Detail, "using seed defaults http://localhost:8001/v1") || !strings.Contains(seed.Fix, "[routes.main]") || !strings.Contains(seed.Fix, conf) {
		t.Errorf("the seed line: %+v", *seed)
	}
	if !main.OK || !main.Warn || !strings.Contains(main.Detail, "http://localhost:8001/v1") ||
		!strings.Contains(main.Fix, "start an OpenAI-compatible server there (e.g. llama-server or vLLM on localhost:8001), or configure [routes.main] (url, model) in "+conf) {
		t.Errorf("the seed agent route that does not answer: %+v; want a warning saying what to start", *main)
	}
	if !fb.OK || !fb.Warn {
		t.Errorf("a seed fallback that does not answer: %+v; want a warning", *fb)
	}
}
