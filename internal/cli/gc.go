package cli

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/klbr-dev/klbr/internal/datadir"
	"github.com/klbr-dev/klbr/internal/store"
)

func newGC(g *globals) *cobra.Command {
	var asJSON, offline bool
	cmd := &cobra.Command{
		Use:   "gc",
		Short: "Remove unpinned old artifacts and releases under [retention], leaving a tombstone for each (online)",
		Long: "gc applies klbr.toml's [retention] (artifact_days, history_days, releases_keep; 0 keeps everything): artifacts first,\n" +
			"then the content of history originals a normal summary covers (the record, its place and its coverage stay, marked\n" +
			"collected), then releases. It never removes\n" +
			"the active or last good release of a session, a release of an attempt that has not ended, of a job or of a draft, nor an\n" +
			"artifact a record of an active context refers to or that was stored again since its cutoff. It runs in klbr-core through\n" +
			"the operator API, one small transaction per removal, while klbr-core serves; --offline opens the data directory itself\n" +
			"(klbr-core stopped).",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var res datadir.GCResult
			if offline {
				cfg, err := g.config()
				if err != nil {
					return err
				}
				st, err := store.Open(cmd.Context(), cfg.Paths.DataDir, store.Options{})
				if err != nil {
					return err
				}
				defer st.Close()
				if res, err = datadir.GC(cmd.Context(), st, cfg.File.Retention, time.Now()); err != nil {
					return err
				}
				if err := st.Close(); err != nil {
					return err
				}
			} else {
				c, err := g.client()
				if err != nil {
					return err
				}
				defer c.Close()
				if res, err = c.GC(cmd.Context()); err != nil {
					return fmt.Errorf("gc: %w", err)
				}
			}
			if asJSON {
				return printJSON(g.env.Stdout, res)
			}
			for _, r := range res.Removed {
				fmt.Fprintf(g.env.Stdout, "removed %s %s (%d bytes): %s\n", r.Kind, r.Ref, r.Size, r.Reason)
			}
			if h := res.History; h.Records > 0 {
				fmt.Fprintf(g.env.Stdout, "collected the content of %d history records (%.1f MB, reused inside runtime.sqlite)\n", h.Records, float64(h.Bytes)/1e6)
			}
			fmt.Fprintf(g.env.Stdout, "gc: %d removed, %.1f MB freed; %d releases pinned\n", len(res.Removed), float64(res.Bytes)/1e6, len(res.Pinned))
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print what was removed and what is pinned as JSON")
	cmd.Flags().BoolVar(&offline, "offline", false, "open the data directory directly (klbr-core must be stopped)")
	return cmd
}
