package cli

import (
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/klbr-dev/klbr/internal/api"
)

func newStatus(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status [SESSION]",
		Short: "Show the daemon's state, or one session's",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			if len(args) == 1 {
				s, err := c.Session(cmd.Context(), args[0])
				if err != nil {
					return err
				}
				if asJSON {
					return printJSON(g.env.Stdout, s)
				}
				printSessions(g, []api.SessionStatus{s})
				return nil
			}
			st, err := c.Status(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(g.env.Stdout, st)
			}
			state := "serving"
			if st.Draining {
				state = "draining"
			}
			fmt.Fprintf(g.env.Stdout, "klbr-core %s: %s, pid %d, up %s\n", st.Version, state, st.PID, time.Since(st.StartedAt).Round(time.Second))
			fmt.Fprintf(g.env.Stdout, "data %s · sqlite %s · placement %s · workbench %s\n", st.DataDir, st.SQLite, st.Placement, st.Workbench)
			for _, n := range st.PlacementNotes {
				fmt.Fprintf(g.env.Stdout, "  (placement skipped %s)\n", n)
			}
			fmt.Fprintln(g.env.Stdout)
			printSessions(g, st.Sessions)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print as JSON")
	return cmd
}

func printSessions(g *globals, ss []api.SessionStatus) {
	tw := tabwriter.NewWriter(g.env.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SESSION\tSTATE\tPENDING\tKERNEL\tBEHAVIOR\tRELEASE\tSINCE")
	for _, s := range ss {
		state := string(s.State)
		if s.Draining {
			state += " (draining)"
		}
		rev := s.PolicyRevision
		if len(rev) > 12 {
			rev = rev[:12]
		} else if rev == "" {
			rev = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%s\t%s\n", s.ID, state, s.Pending, s.KernelGen, s.BehaviorEpoch, rev, s.UpdatedAt.Local().Format(time.DateTime))
	}
	tw.Flush()
}
