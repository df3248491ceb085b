package cli

import (
	"fmt"

	"github.com/spf13/cobra"
)

func newOpen(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "open",
		Short: "Print the running daemon's browser URL with the operator token (as Jupyter does), from any shell",
		Long: "open asks the running daemon over its control socket where its browser UI listens and for the operator token, " +
			"so the URL is right whatever address it bound. With no daemon answering it says so and exits 1.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			b, err := c.Browser(cmd.Context())
			if err != nil {
				return fmt.Errorf("open: %w", err)
			}
			fmt.Fprintln(g.env.Stdout, b.URL)
			return nil
		},
	}
}
