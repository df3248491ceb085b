package cli

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/klbr-dev/klbr/internal/config"
	"github.com/klbr-dev/klbr/internal/doctor"
	"github.com/klbr-dev/klbr/internal/localclient"
)

// errDoctor makes doctor exit non-zero after it printed its report.
var errDoctor = errors.New("doctor found problems (marked FAIL above)")

func newDoctor(g *globals) *cobra.Command {
	var asJSON, verbose bool
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "Check paths, config, model routes, SQLite, the data directory and its lock, and Python; exits non-zero on any failure",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			r := doctor.Run(cmd.Context(), g.env.Lookup, doctor.Options{InForce: g.inForce, Verbose: verbose})
			if asJSON {
				if err := printJSON(g.env.Stdout, r); err != nil {
					return err
				}
			} else {
				fmt.Fprint(g.env.Stdout, r.Text(verbose))
			}
			if !r.OK {
				return errDoctor
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the report as JSON")
	cmd.Flags().BoolVarP(&verbose, "verbose", "v", false, "print the long details too: the sandbox's paragraph (what is not enforced here and what to do), SQLite's compile options")
	return cmd
}

// inForce asks the daemon serving the control socket what it runs; nil
// and no error when no daemon serves there.
func (g *globals) inForce(ctx context.Context) (*doctor.InForce, error) {
	paths, err := config.LoadPaths(g.env.Lookup)
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(paths.ControlSocket); errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	c := localclient.New(paths.ControlSocket)
	defer c.Close()
	st, err := c.Status(ctx)
	if errors.Is(err, syscall.ECONNREFUSED) {
		return nil, nil // a socket a stopped daemon left
	}
	if err != nil {
		return nil, err
	}
	return &doctor.InForce{Agent: st.Agent, Config: st.Config}, nil
}
