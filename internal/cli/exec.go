package cli

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/klbr-dev/klbr/internal/admission"
	"github.com/klbr-dev/klbr/internal/api"
)

func newExec(g *globals) *cobra.Command {
	var asJSON bool
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "exec SESSION CODE",
		Short: "Run Python in a session's workbench, as a cell (CODE - reads stdin); prints its output and value",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			code := args[1]
			if code == "-" {
				b, err := io.ReadAll(io.LimitReader(g.env.Stdin, admission.MaxBodyBytes+1))
				if err != nil {
					return fmt.Errorf("read stdin: %w", err)
				}
				code = string(b)
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			res, err := c.Exec(cmd.Context(), args[0], api.ExecRequest{Code: code, TimeoutSeconds: timeout.Seconds()})
			if err != nil {
				return err
			}
			o := res.Outcome
			if asJSON {
				if err := printJSON(g.env.Stdout, res); err != nil {
					return err
				}
				if o.Status != "ok" {
					return fmt.Errorf("cell %d ended %s", res.Execution, o.Status)
				}
				return nil
			}
			for _, ch := range o.Output.Preview {
				w := g.env.Stdout
				if ch.Stream == "stderr" {
					w = g.env.Stderr
				}
				io.WriteString(w, ch.Data)
			}
			if o.Output.OmittedBytes > 0 {
				where := "it could not be stored: " + o.Output.SpoolError
				if o.Output.Artifact != nil {
					where = "all of it is in artifact sha256:" + o.Output.Artifact.SHA256
				}
				fmt.Fprintf(g.env.Stderr, "… %d more bytes of output; %s\n", o.Output.OmittedBytes, where)
			}
			if o.Value != nil {
				fmt.Fprintln(g.env.Stdout, *o.Value)
			}
			if o.Error != nil {
				msg := o.Error.Traceback
				if msg == "" {
					msg = o.Error.Type + ": " + o.Error.Message
				}
				fmt.Fprintln(g.env.Stderr, strings.TrimRight(msg, "\n"))
			}
			if o.Reset {
				fmt.Fprintf(g.env.Stderr, "the workbench (generation %d) was reset: its Python state is gone\n", o.Generation)
			}
			if o.Status != "ok" {
				return fmt.Errorf("cell %d ended %s", res.Execution, o.Status)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the recorded outcome as JSON")
	cmd.Flags().DurationVar(&timeout, "timeout", time.Minute, "interrupt the cell after this long")
	return cmd
}

func newReset(g *globals) *cobra.Command {
	var reason string
	var kernel bool
	cmd := &cobra.Command{
		Use:   "reset SESSION [--kernel]",
		Short: "Start a new context for a session (the archive and durable work are kept); --kernel also restarts its workbench",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			a, err := c.Reset(cmd.Context(), args[0], reason, kernel)
			if err != nil {
				return err
			}
			fmt.Fprintln(g.env.Stdout, a.Message)
			return nil
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why, for the record")
	cmd.Flags().BoolVar(&kernel, "kernel", false, "also kill the workbench: the next cell starts a new generation, Python state is not restored")
	return cmd
}

func newCompact(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "compact SESSION",
		Short: "Compact a session's context now: its oldest history becomes a summary (the originals stay readable)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			a, err := c.Compact(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(g.env.Stdout, a)
			}
			fmt.Fprintln(g.env.Stdout, a.Message)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the result as JSON")
	return cmd
}
