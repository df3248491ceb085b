package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/klbr-dev/klbr/internal/api"
)

func newReload(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "reload",
		Short: "Reread klbr.toml in the running daemon and apply what can change live (as SIGHUP does)",
		Long: "Rereads klbr.toml: routes, the agent's route and fallbacks, its budgets, [spend] caps and\n" +
			"[discord] ambient_wake apply at once, to the next model request; [hosts] and [retention] apply at once\n" +
			"too (a removed host takes no new job). Settings that need a restart\n" +
			"are named. A file that does not parse is refused with the parser's error and the running\n" +
			"configuration stays. klbr-discord reads its own [discord] settings: SIGHUP to it applies its channel\n" +
			"filter (channels, ingest, include_bots); its token and API take a restart.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			out, err := c.Reload(cmd.Context())
			if err != nil {
				return fmt.Errorf("reload: %w", err)
			}
			if asJSON {
				return printJSON(g.env.Stdout, out)
			}
			printReloaded(g, out)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print as JSON")
	return cmd
}

func printReloaded(g *globals, r api.Reloaded) {
	w := g.env.Stdout
	fmt.Fprintf(w, "reloaded %s in %.0f ms\n", r.Config, r.Seconds*1000)
	if len(r.Applied) == 0 {
		fmt.Fprintln(w, "applied: nothing changed that applies live")
	}
	for _, a := range r.Applied {
		fmt.Fprintln(w, "applied:", a)
	}
	for _, a := range r.Restart {
		fmt.Fprintln(w, "needs a restart (systemctl restart klbr-core):", a)
	}
	fmt.Fprintln(w, "agent:", r.Agent)
}
