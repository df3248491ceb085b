package doctor

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
