package cli

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/klbr-dev/klbr/internal/config"
	"github.com/klbr-dev/klbr/internal/datadir"
)

func newBackup(g *globals) *cobra.Command {
	var asJSON, secrets bool
	cmd := &cobra.Command{
		Use:   "backup DEST",
		Short: "Back up the data directory into DEST (new or empty), while klbr-core serves",
		Long: "backup copies the database through SQLite's online backup API (one consistent snapshot, in bounded steps that\n" +
			"never block klbr-core's writer), then releases/, drafts/, artifacts/, skills/ and klbr.toml, and writes DEST/manifest.json\n" +
			"with every file's SHA-256 last. The operator token and discord-token stay out unless --include-secrets.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			paths, err := config.LoadPaths(g.env.Lookup)
			if err != nil {
				return err
			}
			res, err := datadir.Backup(cmd.Context(), datadir.BackupOptions{DataDir: paths.DataDir, ConfigFile: paths.ConfigFile, Secrets: secrets}, args[0])
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(g.env.Stdout, res)
			}
			fmt.Fprintf(g.env.Stdout, "backup of %s in %s: %d files, %.1f MB in %s (%.1f MB/s); database %d pages in %d steps, longest step %s\n",
				paths.DataDir, res.Dest, res.Files, float64(res.Bytes)/1e6, res.Duration.Round(time.Millisecond), res.MBPerSec,
				res.Database.Pages, res.Database.Steps, res.Database.LongestStep.Round(time.Microsecond))
			if len(res.Left) > 0 {
				fmt.Fprintf(g.env.Stdout, "left out: %s (pass --include-secrets to keep them; restore makes a new operator token)\n", strings.Join(res.Left, ", "))
			}
			for _, s := range res.Skipped {
				fmt.Fprintf(g.env.Stdout, "not carried: %s\n", s)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print what was written as JSON")
	cmd.Flags().BoolVar(&secrets, "include-secrets", false, "include the operator token and a discord-token kept in the data directory")
	return cmd
}

func newRestore(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "restore SRC",
		Short: "Restore the backup SRC into the data directory, which must be new or empty and not in use",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			paths, err := config.LoadPaths(g.env.Lookup)
			if err != nil {
				return err
			}
			res, err := datadir.Restore(cmd.Context(), args[0], paths.DataDir)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(g.env.Stdout, res)
			}
			fmt.Fprintf(g.env.Stdout, "restored %d files (%.1f MB) into %s, every hash verified\n", res.Files, float64(res.Bytes)/1e6, res.DataDir)
			if res.Migrated > 0 {
				fmt.Fprintf(g.env.Stdout, "the database was at schema %d; migrated forward to %d\n", res.Schema, res.Migrated)
			}
			if res.CreatedToken {
				fmt.Fprintln(g.env.Stdout, "the backup held no operator token: a new one was made (klbr-core open prints the browser's link)")
			}
			if res.ConfigFile != "" && res.ConfigFile != paths.ConfigFile {
				fmt.Fprintf(g.env.Stdout, "the backup's klbr.toml is at %s; this klbr-core reads %s\n", res.ConfigFile, paths.ConfigFile)
			}
			fmt.Fprintln(g.env.Stdout, "next: klbr-core check, then start klbr-core")
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the result as JSON")
	return cmd
}

// errCheck makes check exit non-zero after it printed its findings.
var errCheck = errors.New("check found problems (listed above)")

func newCheck(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "check",
		Short: "Verify the data directory (serving or not): integrity, foreign keys, state machines, history coverage, releases, artifacts",
		Long: "check prints one line per finding with what to do: problems first, then harmless leftovers (files no record\n" +
			"names: they take space and nothing else). It exits non-zero only for a problem.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			paths, err := config.LoadPaths(g.env.Lookup)
			if err != nil {
				return err
			}
			res, err := datadir.Check(cmd.Context(), paths.DataDir)
			if err != nil {
				return err
			}
			if asJSON {
				if err := printJSON(g.env.Stdout, res); err != nil {
					return err
				}
			} else {
				// Problems first; then what is harmless (it takes space, nothing
				// else), apart, so it is not read as damage.
				for _, f := range res.Problems() {
					fmt.Fprintln(g.env.Stdout, "PROBLEM", f.String())
				}
				harmless := len(res.Findings) - len(res.Problems())
				for _, f := range res.Findings {
					if f.Harmless {
						fmt.Fprintln(g.env.Stdout, "harmless", f.String())
					}
				}
				state := "clean"
				if !res.Clean() {
					state = fmt.Sprintf("%d problems", len(res.Problems()))
				}
				if harmless > 0 {
					state += fmt.Sprintf(", %d harmless", harmless)
				}
				fmt.Fprintf(g.env.Stdout, "check of %s: %s (%d records, %d releases, %d artifacts, schema %d, in %s)\n",
					paths.DataDir, state, res.Records, res.Releases, res.Files, res.Schema, res.Duration.Round(time.Millisecond))
			}
			if !res.Clean() {
				return errCheck
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the findings as JSON")
	return cmd
}
