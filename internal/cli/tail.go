package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/klbr-dev/klbr/internal/history"
	"github.com/klbr-dev/klbr/internal/store"
)

func newTail(g *globals) *cobra.Command {
	var asJSON, follow bool
	var since string
	cmd := &cobra.Command{
		Use:   "tail SESSION [--since REF] [--follow] [--json]",
		Short: "Print a session's durable records after a record (its ref, e123); --json prints one JSON record a line",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !validCursor(since) {
				return fmt.Errorf("--since %q: give a record's ref as tail prints it (e123), or a seq of 0 or more", since)
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
				return c.FollowFrom(cmd.Context(), args[0], since, print)
			}
			for {
				page, err := c.RecordsFrom(cmd.Context(), args[0], since, 0)
				if err != nil {
					return err
				}
				for _, r := range page.Records {
					if err := print(r); err != nil {
						return err
					}
					since = strconv.FormatInt(r.Seq, 10)
				}
				if !page.More {
					return nil
				}
			}
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "one JSON record a line: seq, id, lane, kind, at, content, …")
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing new records as they are committed")
	cmd.Flags().StringVar(&since, "since", "0", "print records after this one: its ref (e123), or a seq as --json prints it")
	return cmd
}

// validCursor tells whether since is a record's ref (e123) or a seq.
func validCursor(since string) bool {
	if p, err := store.ParseRef(since); err == nil {
		return p.Event != 0
	}
	n, err := strconv.ParseInt(since, 10, 64)
	return err == nil && n >= 0
}

// printRecord prints a record under its ref (e123): the one number history
// read, receipts, the browser and --since take.
func printRecord(w io.Writer, r store.Record) error {
	body := strings.ReplaceAll(describe(r), "\n", "\n         ")
	_, err := fmt.Fprintf(w, "%-8s %s  %-10s %-18s %s\n", store.EventRef(r.ID), r.At.Local().Format(time.TimeOnly), r.Lane, r.Kind, body)
	return err
}

// describe renders a record's content for a person: the text of inputs,
// speech and scratchpad (with the scratchpad's tool calls), a cell's code or
// outcome, a notice's fields; anything else as its JSON.
func describe(r store.Record) string {
	var c struct {
		Text      string `json:"text"`
		Attempt   int64  `json:"attempt"`
		TraceID   string `json:"trace_id"`
		Reasoning string `json:"reasoning"`
		Partial   bool   `json:"partial"`
		Calls     []struct {
			ID        string `json:"id"`
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
		} `json:"tool_calls"`
		Code    string `json:"code"`
		Status  string `json:"status"`
		State   string `json:"state"`
		Message string `json:"message"`
		Reason  string `json:"reason"`
		Value   *string
		Error   *struct{ Type, Message string }
		Output  struct {
			Preview []struct{ Data string } `json:"preview"`
		} `json:"output"`
	}
	if r.Collected != nil {
		return "[" + r.Collected.Text() + "]"
	}
	if json.Unmarshal(r.Content, &c) != nil {
		return string(r.Content)
	}
	var b strings.Builder
	switch {
	case r.Kind == "scratchpad":
		if c.TraceID != "" {
			fmt.Fprintf(&b, "[attempt %d trace %s] ", c.Attempt, c.TraceID)
		}
		if c.Partial {
			b.WriteString("[partial: cut off, never run] ")
		}
		b.WriteString(c.Text)
		for _, call := range c.Calls {
			var args struct{ Code string }
			code := call.Arguments
			if call.Name == "python" && json.Unmarshal([]byte(call.Arguments), &args) == nil {
				code = args.Code
			}
			fmt.Fprintf(&b, "\n→ %s %s:\n  %s", call.Name, call.ID, strings.ReplaceAll(code, "\n", "\n  "))
		}
	case r.Kind == "cell.started":
		b.WriteString(c.Code)
	case r.Kind == "cell.finished":
		b.WriteString(c.Status)
		for _, o := range c.Output.Preview {
			b.WriteString("\n" + strings.TrimSuffix(o.Data, "\n"))
		}
		if c.Value != nil {
			b.WriteString("\n= " + *c.Value)
		}
		if c.Error != nil {
			fmt.Fprintf(&b, "\n%s: %s", c.Error.Type, c.Error.Message)
		}
	case r.Kind == "context.compacted":
		var n struct {
			Summary string `json:"summary"`
			Items   int    `json:"items"`
			Kind    string `json:"kind"`
			Reason  string `json:"reason"`
			Before  int    `json:"tokens_before"`
			After   int    `json:"tokens_after"`
			Text    string `json:"text"`
		}
		if json.Unmarshal(r.Content, &n) != nil || n.Summary == "" {
			return string(r.Content)
		}
		fmt.Fprintf(&b, "summary %s (%s, %s) covers %d records; %s", n.Summary, n.Kind, n.Reason, n.Items, history.Measure(n.Before, n.After))
		if n.Text != "" {
			b.WriteString("\n" + n.Text)
		}
	case r.Kind == "tool.unrun":
		fmt.Fprintf(&b, "%s: %s", c.State, c.Message)
	case c.Text != "":
		b.WriteString(c.Text)
		if c.Status != "" && c.Status != "confirmed" {
			fmt.Fprintf(&b, " [%s: %s]", c.Status, c.Reason)
		}
	default:
		return string(r.Content)
	}
	return b.String()
}
