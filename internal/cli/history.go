package cli

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/klbr-dev/klbr/internal/history"
)

func newHistory(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "history",
		Short: "Search a session's lossless history and read its originals",
	}
	cmd.AddCommand(newHistorySearch(g), newHistoryRead(g), newHistoryChildren(g))
	return cmd
}

func newHistorySearch(g *globals) *cobra.Command {
	var asJSON bool
	var limit int
	var sc history.Scope
	cmd := &cobra.Command{
		Use:   "search SESSION QUERY",
		Short: "Full-text search over inputs, scratchpad, cells, speech and summaries, newest first",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			res, err := c.SearchHistory(cmd.Context(), args[0], args[1], sc, limit)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(g.env.Stdout, res)
			}
			for _, h := range res.Hits {
				fmt.Fprintf(g.env.Stdout, "%-8s %s  %-10s %-18s %s\n", h.Ref, h.At.Local().Format("2006-01-02 15:04"), h.Lane, h.Kind,
					strings.ReplaceAll(h.Preview, "\n", " "))
			}
			if len(res.Hits) == 0 {
				fmt.Fprintln(g.env.Stderr, "no matches")
			}
			if res.Truncated {
				fmt.Fprintf(g.env.Stderr, "more matches: add --before %d\n", res.Next)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the result as JSON")
	cmd.Flags().IntVar(&limit, "limit", 20, "at most this many results (1..200)")
	cmd.Flags().StringVar(&sc.Lane, "lane", "", "only this lane: input, scratchpad, cell, speech or summary")
	cmd.Flags().StringVar(&sc.Conversation, "conversation", "", "only this Discord conversation (an alias such as d1, or a channel id)")
	cmd.Flags().StringVar(&sc.Since, "since", "", "only from this time on (RFC 3339 or YYYY-MM-DD)")
	cmd.Flags().StringVar(&sc.Until, "until", "", "only up to this time")
	cmd.Flags().Int64Var(&sc.Before, "before", 0, "continue a truncated search")
	return cmd
}

func newHistoryRead(g *globals) *cobra.Command {
	var asJSON bool
	var maxBytes int
	var offset int64
	cmd := &cobra.Command{
		Use:   "read REF",
		Short: "Print a record's (e123), summary's (s12) or artifact's (a<sha256>) exact original text",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			res, err := c.ReadHistory(cmd.Context(), args[0], maxBytes, offset)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(g.env.Stdout, res)
			}
			fmt.Fprintln(g.env.Stdout, res.Text)
			if res.Truncated {
				fmt.Fprintf(g.env.Stderr, "truncated at %d bytes (--max-bytes; artifacts continue with --offset %d)\n", maxBytes, res.Offset)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the record with its metadata as JSON")
	cmd.Flags().IntVar(&maxBytes, "max-bytes", history.DefaultReadBytes, "read at most this many bytes")
	cmd.Flags().Int64Var(&offset, "offset", 0, "start an artifact's read here")
	return cmd
}

func newHistoryChildren(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "children REF",
		Short: "List what a summary covers, in order",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			res, err := c.HistoryChildren(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(g.env.Stdout, res)
			}
			for _, ch := range res {
				fmt.Fprintf(g.env.Stdout, "%-8s %s  %s\n", ch.Ref, ch.At.Local().Format("2006-01-02 15:04:05"), ch.Kind)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print as JSON")
	return cmd
}
