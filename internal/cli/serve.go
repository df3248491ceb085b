package cli

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/klbr-dev/klbr/internal/daemon"
)

func newServe(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "serve",
		Short: "Serve klbr (the default): operator socket, HTTP listener, sessions",
		Long: "Serve klbr (the default): operator socket, HTTP listener, sessions.\n\n" +
			"Ctrl-C (or SIGTERM) drains: no new work is accepted, running cells may finish, and the log\n" +
			"says which it waits for. A second Ctrl-C stops now: running cells are interrupted and\n" +
			"recorded as such; admitted inputs stay pending for the next start.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := g.logger()
			if err != nil {
				return err
			}
			cfg, err := g.config()
			if err != nil {
				return err
			}
			// The first signal ends cmd.Context() (main's NotifyContext) and
			// starts the drain; the second one stops now.
			sigs := make(chan os.Signal, 2)
			signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
			defer signal.Stop(sigs)
			stopNow, done := make(chan struct{}), make(chan struct{})
			defer close(done)
			go func() {
				n := 0
				if cmd.Context().Err() != nil {
					n = 1 // the first signal came before Notify
				}
				for {
					select {
					case <-sigs:
						if n++; n == 2 {
							close(stopNow)
							return
						}
					case <-done:
						return
					}
				}
			}()
			// SIGHUP rereads klbr.toml (systemctl reload klbr-core), as klbr-core reload does.
			hup, stop := daemon.NotifyHangup()
			defer stop()
			return daemon.Run(cmd.Context(), cfg, log, daemon.Options{
				StopNow: stopNow,
				Hangup:  hup,
				Ready: func(a daemon.Addrs) {
					fmt.Fprintf(g.env.Stderr, "klbr-core is serving: open http://%s/ (`klbr-core open` prints the URL with your operator token) — operator socket %s; Ctrl-C drains, twice stops now\n", a.HTTP, a.Control)
					if note := cfg.File.SeedNote(cfg.Paths.ConfigFile); note != "" {
						fmt.Fprintf(g.env.Stderr, "klbr-core: %s; nothing answering there? start an OpenAI-compatible server on localhost:8001 (`klbr-core doctor` checks)\n", note)
					}
				},
			})
		},
	}
}
