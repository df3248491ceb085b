package doctor

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klbr-dev/klbr/internal/hosttest"
)

// doctor asks each [hosts.NAME]: a host that answers is a line with its
// systemd and capacity (failing while it has no klbr-kernel: jobs run
// under it there); one that is down fails with the reason.
func TestDoctorChecksHosts(t *testing.T) {
	lab := hosttest.Start(t)
	data := t.TempDir()
	conf := fmt.Sprintf(`[hosts.lab]
ssh = %q
identity_file = %q
known_hosts_file = %q
work_dir = %q
manager = %q

[hosts.gone]
ssh = "root@127.0.0.1:1"
identity_file = %q
known_hosts_file = %q
`, lab.SSH(), lab.IdentityFile, lab.KnownHostsFile, lab.WorkDir, lab.Manager, lab.IdentityFile, lab.KnownHostsFile)
	if err := os.WriteFile(filepath.Join(data, "klbr.toml"), []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"HOME": t.TempDir(), "KLBR_DATA_DIR": data}
	r := Run(context.Background(), func(k string) (string, bool) { v, ok := env[k]; return v, ok }, Options{})
	cs := map[string]Check{}
	for _, c := range r.Checks {
		cs[c.Name] = c
	}
	if c := cs["config"]; !c.OK {
		t.Fatalf("config: %+v", c)
	}
	if c := cs["host lab"]; c.OK || !strings.Contains(c.Detail, "reachable, key known; systemd ") ||
		!strings.Contains(c.Detail, "no klbr-kernel") || !strings.Contains(c.Fix, "services.klbr-worker") {
		t.Fatalf("host lab: %+v", c)
	}
	if c := cs["host gone"]; c.OK || !strings.Contains(c.Detail, "host unreachable") {
		t.Fatalf("host gone: %+v", c)
	}
	if r.OK {
		t.Fatal("doctor passed with a host down")
	}
	if s := r.String(); !strings.Contains(s, "FAIL host gone") {
		t.Fatalf("report:\n%s", s)
	}
}
