package cli

import (
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
)

func newItems(g *globals) *cobra.Command {
	var status string
	var limit int
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "items SESSION [--status pending,seen] [--limit N]",
		Short: "List a session's attention items (Discord DMs and mentions), newest first",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			var statuses []string
			if status != "" {
				statuses = strings.Split(status, ",")
			}
			res, err := c.Items(cmd.Context(), args[0], statuses, limit)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(g.env.Stdout, res)
			}
			tw := tabwriter.NewWriter(g.env.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ITEM\tCONVERSATION\tMESSAGE\tSTATUS\tBY\tNOTE\tSINCE")
			for _, it := range res.Items {
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", it.ID, it.Conversation, it.MessageID, it.Status, it.DecisionOrigin,
					it.Note, it.UpdatedAt.Local().Format(time.DateTime))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().StringVar(&status, "status", "", "only these statuses, comma-separated: pending, seen, acted, ignored")
	cmd.Flags().IntVar(&limit, "limit", 100, "at most this many")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print as JSON")
	return cmd
}

func newMark(g *globals) *cobra.Command {
	var note string
	cmd := &cobra.Command{
		Use:   "mark ITEM STATUS [--note N]",
		Short: "Record the operator's decision on an attention item: seen, acted, ignored, or pending to reopen it",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := strconv.ParseInt(args[0], 10, 64)
			if err != nil {
				return fmt.Errorf("ITEM %q is not a number", args[0])
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			it, err := c.Mark(cmd.Context(), id, args[1], note)
			if err != nil {
				return err
			}
			fmt.Fprintf(g.env.Stdout, "item %d in %s is %s (by %s)\n", it.ID, it.Conversation, it.Status, it.DecisionOrigin)
			return nil
		},
	}
	cmd.Flags().StringVar(&note, "note", "", "why, for the record")
	return cmd
}
