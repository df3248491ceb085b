package cli

import (
	"fmt"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
)

func newHeld(g *globals) *cobra.Command {
	var limit int
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "held [--limit N]",
		Short: "List the Discord sends and reactions delivery.review held, waiting for release or drop",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			res, err := c.Held(cmd.Context(), limit)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(g.env.Stdout, res)
			}
			tw := tabwriter.NewWriter(g.env.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "EFFECT\tSESSION\tCONVERSATION\tKIND\tSINCE\tWHAT\tREASON")
			for _, e := range res.Effects {
				what := e.Text
				if e.Kind == "react" {
					what = e.Emoji + " on " + e.Target
				}
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", e.ID, e.Session, e.Conversation, e.Kind,
					e.CreatedAt.Local().Format(time.DateTime), oneLine(what, 60), oneLine(e.HeldReason, 80))
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			if len(res.Effects) > 0 {
				fmt.Fprintln(g.env.Stderr, "release one with `klbr-core release EFFECT`, or drop it with `klbr-core drop EFFECT`")
			}
			return nil
		},
	}
	cmd.Flags().IntVar(&limit, "limit", 100, "at most this many")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print as JSON")
	return cmd
}

// newDecide is `klbr-core release EFFECT` or `klbr-core drop EFFECT`.
func newDecide(g *globals, release bool) *cobra.Command {
	var note string
	var asJSON bool
	verb, short := "drop", "Refuse a held Discord send or reaction for good"
	if release {
		verb, short = "release", "Let a held Discord send or reaction go out (once, with a receipt naming the release)"
	}
	cmd := &cobra.Command{
		Use:   verb + " EFFECT [--note N]",
		Short: short,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := strconv.ParseInt(args[0], 10, 64)
			if err != nil || id < 1 {
				return fmt.Errorf("EFFECT %q is not an effect id (see klbr-core held)", args[0])
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			decide := c.Drop
			if release {
				decide = c.Release
			}
			e, err := decide(cmd.Context(), id, note)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(g.env.Stdout, e)
			}
			if release {
				fmt.Fprintf(g.env.Stdout, "effect %d (%s in %s) released: it is %s; klbr-core tail %s shows its receipt\n", e.ID, e.Kind, e.Conversation, e.State, e.Session)
			} else {
				fmt.Fprintf(g.env.Stdout, "effect %d (%s in %s) dropped: it is %s\n", e.ID, e.Kind, e.Conversation, e.State)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&note, "note", "", "why, for the record")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the effect as JSON")
	return cmd
}
