package cli

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/klbr-dev/klbr/internal/api"
)

// errHosts makes hosts exit non-zero after it printed its answer.
var errHosts = errors.New("a host cannot run work (see above)")

func newHosts(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "hosts",
		Short: "Ask each worker host ([hosts.NAME]) now: reachable, key, systemd, klbr-kernel and its protocol, capacity, klbr units; exits non-zero when one cannot run work",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			res, err := c.Hosts(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				if err := printJSON(g.env.Stdout, res); err != nil {
					return err
				}
			} else {
				if len(res.Hosts) == 0 {
					fmt.Fprintln(g.env.Stderr, "no hosts: klbr.toml defines no [hosts.NAME] (docs/hosts.md)")
				}
				for _, h := range res.Hosts {
					printHost(g.env.Stdout, h)
				}
			}
			for _, h := range res.Hosts {
				if !h.Ready() {
					return errHosts
				}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print as JSON")
	return cmd
}

func printHost(w io.Writer, h api.HostReport) {
	state := "down"
	if h.Reachable {
		state = "up"
	}
	fmt.Fprintf(w, "%s\t%s\t%s\tjobs %d/%d\n", h.Name, h.SSH, state, h.Reserved, h.MaxJobs)
	if h.Reachable {
		kernel := "no klbr-kernel"
		if h.Kernel != "" {
			kernel = fmt.Sprintf("klbr-kernel %s (protocol %d) at %s", orDash(h.KernelVersion), h.KernelProtocol, h.Kernel)
		}
		fmt.Fprintf(w, "  %s, %s manager; %s; %d CPUs, %.1f GiB\n", orDash(h.Systemd), orDash(h.Manager), kernel, h.CPUs, float64(h.MemoryBytes)/(1<<30))
		for _, u := range h.Units {
			fmt.Fprintf(w, "  %s %s/%s\n", u.Unit, u.Active, u.Sub)
		}
	}
	for _, p := range h.Problems {
		mark := "FAIL"
		if p.Warn {
			mark = "WARN"
		}
		fmt.Fprintf(w, "  %s %s\n", mark, strings.TrimSpace(p.What))
		if p.Fix != "" {
			fmt.Fprintf(w, "       → %s\n", p.Fix)
		}
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
