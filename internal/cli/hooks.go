package cli

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/klbr-dev/klbr/internal/api"
)

func newHooks(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "hooks", Short: "Policy hooks: replay an observer's events"}
	cmd.AddCommand(newHooksReplay(g))
	return cmd
}

func newHooksReplay(g *globals) *cobra.Command {
	var req api.ReplayRequest
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "replay SESSION HANDLER",
		Short: "Deliver an observer's events again to the active release's handler, with fake effects",
		Long: "Deliver the session's events of the kinds HANDLER is bound to (observer event ids --from..--to) again, " +
			"to the active release's handler, starting from an empty state. Effects are fake: nothing is acknowledged, " +
			"no state is written, and the commands it proposes are printed, never carried out.",
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			req.Handler = args[1]
			res, err := c.Replay(cmd.Context(), args[0], req)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(g.env.Stdout, res)
			}
			fmt.Fprintf(g.env.Stdout, "replayed %d events to %s (effects: %s)\n", len(res.Events), res.Handler, res.Effects)
			for _, e := range res.Events {
				var cmds []string
				for _, c := range e.Commands {
					cmds = append(cmds, string(c))
				}
				line := fmt.Sprintf("event %d %s: %d commands", e.Event, e.Kind, len(e.Commands))
				if len(cmds) > 0 {
					line += " " + strings.Join(cmds, " ")
				}
				if e.Problem != "" {
					line += " FAILED: " + e.Problem
				}
				fmt.Fprintln(g.env.Stdout, line)
			}
			return nil
		},
	}
	cmd.Flags().Int64Var(&req.From, "from", 0, "the first observer event id")
	cmd.Flags().Int64Var(&req.To, "to", 0, "the last observer event id (0: the newest)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print as JSON")
	return cmd
}
