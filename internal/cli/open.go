package cli

import (
	"fmt"
	"net/url"

	"github.com/spf13/cobra"

	"github.com/klbr-dev/klbr/internal/setup"
)

func newOpen(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "open",
		Short: "Print the browser URL with the operator token (as Jupyter does); open it on this machine",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := g.config()
			if err != nil {
				return err
			}
			token, err := setup.ReadToken(setup.TokenFile(cfg.Paths.DataDir))
			if err != nil {
				return fmt.Errorf("operator token: %w (run klbr-core init)", err)
			}
			fmt.Fprintf(g.env.Stdout, "http://%s/?token=%s\n", cfg.BindAddr, url.QueryEscape(token))
			return nil
		},
	}
}
