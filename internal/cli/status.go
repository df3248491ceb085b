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
			fmt.Fprintf(g.env.Stdout, "agent: %s\n", st.Agent)
			for _, n := range st.PlacementNotes {
				fmt.Fprintf(g.env.Stdout, "  (placement skipped %s)\n", n)
			}
			if st.Sandbox != "" {
				fmt.Fprintf(g.env.Stdout, "sandbox: %s\n", st.Sandbox)
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
	for _, s := range ss {
		if s.StateReason != "" && (s.State == "paused" || s.State == "stopped") {
			fmt.Fprintf(g.env.Stdout, "%s %s: %s\n", s.ID, s.State, s.StateReason)
		}
		if a := s.Attempt; a != nil {
			fmt.Fprintf(g.env.Stdout, "%s attempt %d: %s after %d steps, %d tokens (woke by: %s)", s.ID, a.ID, a.State, a.Steps, a.Tokens, a.WakeReason)
			if a.Outcome != "" {
				fmt.Fprintf(g.env.Stdout, "; %s", a.Outcome)
			}
			fmt.Fprintln(g.env.Stdout)
		}
		if w := s.Wait; w != nil {
			until := "until input"
			if w.Deadline != nil {
				until = "until input or " + w.Deadline.Local().Format(time.DateTime) + " (" + time.Until(*w.Deadline).Round(time.Second).String() + ")"
			}
			fmt.Fprintf(g.env.Stdout, "%s waits %s: %s\n", s.ID, until, w.Reason)
		}
	}
}
