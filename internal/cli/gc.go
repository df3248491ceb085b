package cli

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/klbr-dev/klbr/internal/datadir"
	"github.com/klbr-dev/klbr/internal/store"
)

func newGC(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "gc",
		Short: "Remove unpinned old releases and artifacts under [retention], leaving a tombstone for each (klbr-core stopped)",
		Long: "gc applies klbr.toml's [retention] (releases_keep, artifact_days; 0 keeps everything). It never removes the active or\n" +
			"last good release of a session, a release of an attempt that has not ended, of a job or of a draft, nor an artifact a\n" +
			"record of an active context refers to. It opens the data directory for writing, so klbr-core must be stopped.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := g.config()
			if err != nil {
				return err
			}
			st, err := store.Open(cmd.Context(), cfg.Paths.DataDir, store.Options{})
			if err != nil {
				return err
			}
			defer st.Close()
			res, err := datadir.GC(cmd.Context(), st, cfg.File.Retention, time.Now())
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(g.env.Stdout, res)
			}
			for _, r := range res.Removed {
				fmt.Fprintf(g.env.Stdout, "removed %s %s (%d bytes): %s\n", r.Kind, r.Ref, r.Size, r.Reason)
			}
			fmt.Fprintf(g.env.Stdout, "gc: %d removed, %.1f MB freed; %d releases pinned\n", len(res.Removed), float64(res.Bytes)/1e6, len(res.Pinned))
			return st.Close()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print what was removed and what is pinned as JSON")
	return cmd
}
