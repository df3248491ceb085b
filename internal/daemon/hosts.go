package daemon

import (
	"path/filepath"

	"github.com/klbr-dev/klbr/internal/config"
	"github.com/klbr-dev/klbr/internal/hosts"
)

// startHosts makes the engine of the worker hosts, when klbr.toml has any:
// jobs dispatch through it, and `klbr-core hosts` asks through it whether
// cells run here or not. Nothing connects until a host is used.
func (d *daemon) startHosts(cfg *config.Config) error {
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
	return nil
}
