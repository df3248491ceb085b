package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/klbr-dev/klbr/internal/daemon"
)

func newServe(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "serve",
		Short: "Serve klbr (the default): operator socket, HTTP listener, sessions",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := g.logger()
			if err != nil {
				return err
			}
			cfg, err := g.config()
			if err != nil {
				return err
			}
			// SIGHUP rereads klbr.toml (systemctl reload klbr-core), as klbr-core reload does.
			hup, stop := daemon.NotifyHangup()
			defer stop()
			return daemon.Run(cmd.Context(), cfg, log, daemon.Options{
				Hangup: hup,
				Ready: func(a daemon.Addrs) {
					fmt.Fprintf(g.env.Stderr, "klbr-core is serving: open http://%s/ (`klbr-core open` prints the URL with your operator token) — operator socket %s\n", a.HTTP, a.Control)
				},
			})
		},
	}
}
