package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/klbr-dev/klbr/internal/config"
	"github.com/klbr-dev/klbr/internal/hosts"
	"github.com/klbr-dev/klbr/internal/metrics"
	"github.com/klbr-dev/klbr/internal/store"
	"github.com/klbr-dev/klbr/internal/workbench"
)

// startHosts makes the engine of the worker hosts, when klbr.toml has any:
// jobs dispatch through it, and `klbr-core hosts` and /metrics ask through
// it whether cells run here or not. Nothing connects until a host is used.
func (d *daemon) startHosts(cfg *config.Config, m *metrics.Metrics) error {
	if len(cfg.File.Hosts) == 0 {
		return nil
	}
	hs, err := hosts.FromConfig(cfg.File)
	if err != nil {
		return err
	}
	eng, err := hosts.New(hosts.Config{Hosts: hs, ControlDir: filepath.Join(cfg.Paths.DataDir, "ssh"),
		Log: d.log.With("component", "hosts")})
	if err != nil {
		return err
	}
	d.hosts = eng
	m.WatchHosts(d.hostStates)
	return nil
}

// maxWaitingScan bounds the pending jobs read per scrape to count the work
// waiting for each host.
const maxWaitingScan = 1000

// hostStates is each host for /metrics: up as last seen, the job slots its
// units hold, and the pending jobs that can run only there.
func (d *daemon) hostStates(ctx context.Context) []metrics.HostState {
	waiting := map[string]int{}
	if pending, err := d.store.Jobs(ctx, store.JobFilter{State: store.JobPending, Kind: "command", Limit: maxWaitingScan}); err == nil {
		for _, j := range pending {
			var spec struct {
				Host string `json:"host"`
			}
			if json.Unmarshal(j.Spec, &spec) != nil || spec.Host == "" {
				continue
			}
			for _, h := range d.hosts.Matches(spec.Host) {
				waiting[h]++
			}
		}
	}
	// A running child agent on a host: its job's host is where it works.
	children := map[string]int{}
	if running, err := d.store.Jobs(ctx, store.JobFilter{State: store.JobRunning, Kind: "child", Limit: maxWaitingScan}); err == nil {
		for _, j := range running {
			if j.Host != "" {
				children[j.Host]++
			}
		}
	}
	var out []metrics.HostState
	for _, s := range d.hosts.Statuses() {
		out = append(out, metrics.HostState{Name: s.Name, Up: s.Up, Units: map[string]int{"job": s.Reserved, "child": children[s.Name]}, Waiting: waiting[s.Name]})
	}
	return out
}

// EnvRemotePlacement names the worker host the root session's workbench
// runs on; it takes precedence over [agent] host. Unset: [agent] host.
const EnvRemotePlacement = "KLBR_REMOTE_PLACEMENT"

// remoteWorkbench is where the root session's workbench runs: nil for
// here, else the host KLBR_REMOTE_PLACEMENT or [agent] host names, which
// must be one of [hosts].
func (d *daemon) remoteWorkbench(cfg *config.Config) (*workbench.Remote, error) {
	name, from := os.Getenv(EnvRemotePlacement), EnvRemotePlacement
	if name == "" {
		name, from = cfg.File.Agent.Host, "[agent] host"
	}
	if name == "" {
		return nil, nil
	}
	if _, ok := cfg.File.Hosts[name]; !ok || d.hosts == nil {
		return nil, fmt.Errorf("%s names host %q, but klbr.toml has no [hosts.%s]: define it (docs/hosts.md) or unset %s", from, name, name, from)
	}
	d.log.Info("the root session's workbench runs on a worker host", "host", name, "from", from)
	return &workbench.Remote{Hosts: d.hosts, Host: name}, nil
}
