package cli

import (
	"fmt"

	"github.com/klbr-dev/klbr/internal/api"

	"github.com/spf13/cobra"
)

func newOpen(g *globals) *cobra.Command {
	var rotate bool
	cmd := &cobra.Command{
		Use:   "open",
		Short: "Print the running daemon's browser URL with the operator token (as Jupyter does), from any shell",
		Long: "open asks the running daemon over its control socket where its browser UI listens and for the operator token, " +
			"so the URL is right whatever address it bound. With no daemon answering it says so and exits 1. " +
			"--rotate makes a new operator token first: every browser signed in with the old one is signed out " +
			"(its open pages disconnect) and the printed URL signs in again.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			var b api.Browser
			if rotate {
				b, err = c.RotateToken(cmd.Context())
			} else {
				b, err = c.Browser(cmd.Context())
			}
			if err != nil {
				return fmt.Errorf("open: %w", err)
			}
			if rotate {
				fmt.Fprintln(g.env.Stderr, "open: the operator token was rotated; every browser is signed out")
			}
			fmt.Fprintln(g.env.Stdout, b.URL)
			return nil
		},
	}
	cmd.Flags().BoolVar(&rotate, "rotate", false, "make a new operator token and sign every browser out")
	return cmd
}
