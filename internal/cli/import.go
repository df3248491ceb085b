package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/klbr-dev/klbr/internal/config"
	"github.com/klbr-dev/klbr/internal/datadir"
)

func newImport(g *globals) *cobra.Command {
	var asJSON bool
	var soul string
	cmd := &cobra.Command{
		Use:   "import [SRC]",
		Short: "Import another deployment's backup, or the previous runtime's KDL model configuration and soul file (never into a live data directory)",
		Long: "import SRC, where SRC is a klbr backup (a directory with manifest.json), restores it into the data directory (new or\n" +
			"empty): the move to a new machine. SRC a KDL file: its llm blocks become [routes.NAME] in klbr.toml. --soul FILE makes the\n" +
			"previous soul file a behavior draft for review. klbr-core must not be serving the data directory.",
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 && soul == "" {
				return errors.New("import: give a backup directory or a KDL file, or --soul FILE")
			}
			paths, err := config.LoadPaths(g.env.Lookup)
			if err != nil {
				return err
			}
			out := map[string]any{}
			if len(args) == 1 {
				src := args[0]
				if _, err := os.Stat(filepath.Join(src, datadir.ManifestName)); err == nil {
					res, err := datadir.Restore(cmd.Context(), src, paths.DataDir)
					if err != nil {
						return err
					}
					out["restored"] = res
					if !asJSON {
						fmt.Fprintf(g.env.Stdout, "imported the backup %s into %s (%d files, every hash verified)\n", src, res.DataDir, res.Files)
					}
				} else {
					f, err := os.Open(src)
					if err != nil {
						return fmt.Errorf("import: %w", err)
					}
					data, err := io.ReadAll(io.LimitReader(f, datadir.MaxKDLBytes+1))
					f.Close()
					if err != nil {
						return fmt.Errorf("import: %w", err)
					}
					res, err := datadir.ImportKDL(cmd.Context(), data, paths.ConfigFile, paths.DataDir)
					if err != nil {
						return err
					}
					out["routes"] = res
					if !asJSON {
						for _, r := range res.Routes {
							fmt.Fprintf(g.env.Stdout, "route %s: %s (%s)\n", r.Name, r.URL, r.Model)
							if r.KeyWritten != "" {
								fmt.Fprintf(g.env.Stdout, "  its API key moved from the KDL file to %s (0600); klbr.toml names the file\n", r.KeyWritten)
							}
						}
						fmt.Fprintf(g.env.Stdout, "written to %s; check with `klbr-core doctor` and `klbr-core route test NAME`\n", res.ConfigFile)
					}
				}
			}
			if soul != "" {
				res, err := datadir.ImportSoul(cmd.Context(), soul, paths.DataDir)
				if err != nil {
					return err
				}
				out["soul"] = res
				if !asJSON {
					fmt.Fprintf(g.env.Stdout, "the soul file is draft %s at %s, on release %.12s; review it, then publish and activate it\n", res.Draft, res.Path, res.ParentRelease)
				}
			}
			if asJSON {
				return printJSON(g.env.Stdout, out)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print what was imported as JSON")
	cmd.Flags().StringVar(&soul, "soul", "", "the previous runtime's soul file, to become a behavior draft")
	return cmd
}
