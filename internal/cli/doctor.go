package cli

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/klbr-dev/klbr/internal/doctor"
)

// errDoctor makes doctor exit non-zero after it printed its report.
var errDoctor = errors.New("doctor found problems (marked FAIL above)")

func newDoctor(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "Check paths, config, model routes, SQLite, the data directory and its lock, and Python; exits non-zero on any failure",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			r := doctor.Run(cmd.Context(), g.env.Lookup)
			if asJSON {
				if err := printJSON(g.env.Stdout, r); err != nil {
					return err
				}
			} else {
				fmt.Fprint(g.env.Stdout, r.String())
			}
			if !r.OK {
				return errDoctor
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the report as JSON")
	return cmd
}
