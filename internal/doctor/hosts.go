package doctor

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/klbr-dev/klbr/internal/config"
	"github.com/klbr-dev/klbr/internal/hosts"
)

// checkHosts asks every [hosts.NAME], at once and each over a connection
// of its own (doctor does not share klbr-core's): reachable with its key
// known, its systemd, klbr-kernel and its protocol, capacity, and the
// klbr-* units running there now. One line a host.
func checkHosts(ctx context.Context, cfg *config.Config, add func(Check)) {
	if len(cfg.File.Hosts) == 0 {
		return
	}
	hs, err := hosts.FromConfig(cfg.File)
	if err != nil {
		add(Check{Name: "hosts", Detail: err.Error(), Fix: "correct the [hosts.NAME] named above in " + cfg.Paths.ConfigFile})
		return
	}
	eng, err := hosts.New(hosts.Config{Hosts: hs, ConnectTimeout: 5 * time.Second})
	if err != nil {
		add(Check{Name: "hosts", Detail: err.Error(), Fix: "check that a private temporary directory can be made"})
		return
	}
	defer eng.Close()
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	names := eng.Names()
	infos := make([]hosts.Info, len(names))
	var wg sync.WaitGroup
	for i, name := range names {
		wg.Go(func() { infos[i] = eng.Inspect(ctx, name) })
	}
	wg.Wait()
	for _, info := range infos {
		add(hostCheck(info))
	}
}

func hostCheck(info hosts.Info) Check {
	c := Check{Name: "host " + info.Name, OK: true}
	if info.Reachable {
		running := 0
		for _, u := range info.Units {
			if u.Active == "active" {
				running++
			}
		}
		kernel := "no klbr-kernel"
		if info.Kernel != "" {
			kernel = fmt.Sprintf("klbr-kernel %s protocol %d", info.KernelVersion, info.KernelProtocol)
		}
		c.Detail = fmt.Sprintf("%s: reachable, key known; systemd %d, %s manager; %s; %d CPUs, %.1f GiB, max_jobs %d; %d klbr units active",
			info.SSH, info.SystemdVersion, info.Manager, kernel, info.CPUs, float64(info.MemoryBytes)/(1<<30), info.MaxJobs, running)
	}
	for _, p := range info.Problems() {
		if p.Warn {
			c.Warn = true
		} else {
			c.OK = false
		}
		if c.Detail != "" {
			c.Detail += "; "
		}
		c.Detail += p.What
		if c.Fix != "" {
			c.Fix += "; "
		}
		c.Fix += p.Fix
	}
	return c
}
