package localapi

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/config"
	"github.com/klbr-dev/klbr/internal/hosts"
	"github.com/klbr-dev/klbr/internal/hosttest"
	"github.com/klbr-dev/klbr/internal/httpguard"
)

// GET /v1/hosts asks every host now: one that answers with its systemd and
// capacity, and one whose key is not known, refused with the fix. Without
// hosts, the list is empty.
func TestHostsAreInspected(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if res, err := start(t).client.Hosts(ctx); err != nil || res.Hosts == nil || len(res.Hosts) != 0 {
		t.Fatalf("without hosts: %+v, %v", res, err)
	}
	lab := hosttest.Start(t)
	lab.InstallKernel(t) // jobs run under it: a host without it is not ready
	tg, err := config.ParseSSHTarget(lab.SSH())
	if err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(t.TempDir(), "known_hosts")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	base := hosts.Host{Target: tg, IdentityFile: lab.IdentityFile, KnownHostsFile: lab.KnownHostsFile, MaxJobs: 3,
		MemoryMaxBytes: 64 << 20, TasksMax: 16, CPUQuotaPct: 100, Wall: time.Hour, WorkDir: lab.WorkDir}
	good, stranger := base, base
	good.Name, stranger.Name, stranger.KnownHostsFile = "lab", "stranger", empty
	eng, err := hosts.New(hosts.Config{Hosts: map[string]hosts.Host{"lab": good, "stranger": stranger}, ConnectTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	h := startWith(t, httpguard.Limits{}, func(s *Server) { s.WithHosts(eng) })
	res, err := h.client.Hosts(ctx)
	if err != nil || len(res.Hosts) != 2 {
		t.Fatalf("hosts: %+v, %v", res, err)
	}
	l, s := res.Hosts[0], res.Hosts[1]
	if l.Name != "lab" || !l.Reachable || l.SystemdVersion < hosts.MinSystemd || l.CPUs < 1 || l.MaxJobs != 3 || !l.Ready() {
		t.Fatalf("lab: %+v", l)
	}
	if s.Name != "stranger" || s.Reachable || s.Ready() || !strings.Contains(s.Error, "ssh-keyscan -p 2222 "+lab.Addr+" >> "+empty) ||
		len(s.Problems) != 1 {
		t.Fatalf("a host whose key is unknown: %+v", s)
	}
}
