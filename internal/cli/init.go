package cli

import (
	"fmt"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/klbr-dev/klbr/internal/setup"
)

func newInit(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "init",
		Short: "Create the data directory, database, operator token and default session (idempotent)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := g.config()
			if err != nil {
				return err
			}
			res, err := setup.Init(cmd.Context(), cfg.Paths.DataDir)
			if err != nil {
				return err
			}
			if def := filepath.Join(cfg.Paths.DataDir, "klbr.toml"); cfg.Paths.ConfigFile == def {
				res.ConfigFile = def
				if res.CreatedConfig, err = setup.WriteConfigTemplate(def); err != nil {
					return fmt.Errorf("init: %w", err)
				}
			}
			if asJSON {
				return printJSON(g.env.Stdout, res)
			}
			verb := "exists"
			if res.CreatedDB {
				verb = "created"
			}
			fmt.Fprintf(g.env.Stdout, "data directory %s: %s\n", res.DataDir, verb)
			if res.CreatedToken {
				fmt.Fprintf(g.env.Stdout, "operator token written to %s\n", res.TokenFile)
			}
			if res.CreatedSession {
				fmt.Fprintln(g.env.Stdout, "session default created")
			}
			if res.CreatedConfig {
				fmt.Fprintf(g.env.Stdout, "configuration template written to %s: name a model route there to run the agent\n", res.ConfigFile)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the result as JSON")
	return cmd
}
