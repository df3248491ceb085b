package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/klbr-dev/klbr/internal/store"
)

func newTail(g *globals) *cobra.Command {
	var asJSON, follow bool
	var since int64
	cmd := &cobra.Command{
		Use:   "tail SESSION [--since CURSOR] [--follow] [--json]",
		Short: "Print a session's durable records after a cursor; --json prints one JSON record a line",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if since < 0 {
				return fmt.Errorf("--since must be a cursor (a record's seq) of 0 or more")
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			enc := json.NewEncoder(g.env.Stdout)
			print := func(r store.Record) error {
				if asJSON {
					return enc.Encode(r)
				}
				return printRecord(g.env.Stdout, r)
			}
			if follow {
				return c.Follow(cmd.Context(), args[0], since, print)
			}
			for {
				page, err := c.Records(cmd.Context(), args[0], since, 0)
				if err != nil {
					return err
				}
				for _, r := range page.Records {
					if err := print(r); err != nil {
						return err
					}
					since = r.Seq
				}
				if !page.More {
					return nil
				}
			}
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "one JSON record a line: seq, id, lane, kind, at, content, …")
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing new records as they are committed")
	cmd.Flags().Int64Var(&since, "since", 0, "print records after this cursor (seq)")
	return cmd
}

func printRecord(w io.Writer, r store.Record) error {
	var body string
	var content struct {
		Text string `json:"text"`
	}
	if json.Unmarshal(r.Content, &content) == nil && content.Text != "" {
		body = content.Text
	} else {
		body = string(r.Content)
	}
	body = strings.ReplaceAll(body, "\n", "\n        ")
	_, err := fmt.Fprintf(w, "%6d  %s  %-7s %-18s %s\n", r.Seq, r.At.Local().Format(time.TimeOnly), r.Lane, r.Kind, body)
	return err
}
