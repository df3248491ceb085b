package cli

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strconv"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/klbr-dev/klbr/internal/activation"
	"github.com/klbr-dev/klbr/internal/api"
	"github.com/klbr-dev/klbr/internal/behavior"
	"github.com/klbr-dev/klbr/internal/config"
	"github.com/klbr-dev/klbr/internal/store"
)

func newReleases(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "releases",
		Short: "List behavior releases and each session's active epoch and history",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			r, err := c.Releases(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(g.env.Stdout, r)
			}
			tw := tabwriter.NewWriter(g.env.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "SESSION\tEPOCH\tKIND\tRELEASE\tWHEN\tREASON")
			for _, s := range r.Sessions {
				for _, a := range s.History {
					mark := " "
					if a.Epoch == s.Epoch {
						mark = "*"
					}
					fmt.Fprintf(tw, "%s\t%s%d\t%s\t%s\t%s\t%s\n", s.Session, mark, a.Epoch, a.Kind, a.Release[:12], a.ActivatedAt.Local().Format("2006-01-02 15:04:05"), a.Reason)
				}
			}
			tw.Flush()
			fmt.Fprintln(g.env.Stdout)
			for _, rel := range r.Releases {
				state := fmt.Sprintf("%d files, skills %v", rel.Files, rel.Skills)
				if rel.Problem != "" {
					state = "CORRUPT: " + rel.Problem
				}
				fmt.Fprintf(g.env.Stdout, "%s  %s\n", rel.Path, state)
				if rel.Validation != nil {
					fmt.Fprintf(g.env.Stdout, "    %s\n", validationLine(*rel.Validation))
				}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print as JSON")
	cmd.AddCommand(newReleasesDiff(g))
	return cmd
}

// newReleasesDiff prints the diff between two stored releases. It reads the
// release directory itself: no daemon is needed.
func newReleasesDiff(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "diff A B",
		Short: "Print the unified diff from release A to release B (ids, unique id prefixes, or <data>/releases/<sha256> paths)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			paths, err := config.LoadPaths(g.env.Lookup)
			if err != nil {
				return err
			}
			rel, err := behavior.Open(filepath.Join(paths.DataDir, "releases"))
			if err != nil {
				return err
			}
			var ids [2]string
			for i, ref := range args {
				if ids[i], err = rel.Resolve(ref); err != nil {
					return err
				}
			}
			d, truncated, err := rel.Diff(cmd.Context(), ids[0], ids[1])
			if err != nil {
				return err
			}
			fmt.Fprint(g.env.Stdout, d)
			if truncated {
				fmt.Fprintf(g.env.Stderr, "the diff is over %d bytes and was cut there\n", behavior.MaxDiffBytes)
			}
			return nil
		},
	}
}

func newPublish(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "publish DIR",
		Short: "Publish a behavior tree as an immutable release; prints its id (activate it with `activate`)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			dir, err := filepath.Abs(args[0])
			if err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			r, err := c.Publish(cmd.Context(), dir)
			if err != nil {
				return err
			}
			fmt.Fprintln(g.env.Stdout, r.ID)
			fmt.Fprintf(g.env.Stderr, "published %s: %d files, skills %v\n", r.Path, r.Files, r.Skills)
			return nil
		},
	}
}

func newActivate(g *globals) *cobra.Command {
	var reason string
	cmd := &cobra.Command{
		Use:   "activate SESSION EPOCH RELEASE",
		Short: "Activate a release (id, unique id prefix, or <data>/releases/<sha256> path) for a session at its current EPOCH",
		Long: "EPOCH is the session's current behavior epoch as `klbr-core releases` shows it: the activation\n" +
			"is refused if the session has moved on since (compare-and-swap). The candidate is checked in its\n" +
			"own hook worker first; only what the change needs is replaced.",
		Args: cobra.ExactArgs(3),
		RunE: func(cmd *cobra.Command, args []string) error {
			epoch, err := strconv.ParseInt(args[1], 10, 64)
			if err != nil || epoch < 0 {
				return fmt.Errorf("EPOCH %q: want the session's current epoch, a number", args[1])
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			res, err := c.Activate(cmd.Context(), args[0], api.ActivateRequest{ExpectedEpoch: epoch, Release: args[2], Reason: reason})
			if err != nil {
				return err
			}
			printActivation(g, res)
			return nil
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why, for the record")
	return cmd
}

func newRollback(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "rollback SESSION",
		Short: "Activate the session's newest earlier release that still verifies",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			res, err := c.Rollback(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			printActivation(g, res)
			return nil
		},
	}
}

func printActivation(g *globals, r activation.Result) {
	replaced := "no process replaced"
	if len(r.Replaced) > 0 {
		replaced = fmt.Sprintf("replaced %v", r.Replaced)
	}
	fmt.Fprintf(g.env.Stdout, "session %s is at epoch %d: release %s (%s change, %s)\n", r.Session, r.Epoch, r.Release, r.Kind, replaced)
}

// validationLine summarizes a stored validation report on one line.
func validationLine(v store.Validation) string {
	var rep activation.Report
	if err := json.Unmarshal(v.Report, &rep); err != nil {
		return "validation report unreadable: " + err.Error()
	}
	verdict := "validated ok"
	if !v.OK {
		verdict = "REFUSED: " + rep.Refused
	}
	own := "absent"
	switch {
	case rep.OwnTests.Error != "":
		own = "did not run"
	case rep.OwnTests.Present && rep.OwnTests.Passed:
		own = "passed"
	case rep.OwnTests.Present:
		own = fmt.Sprintf("failed (exit %d)", rep.OwnTests.ExitCode)
	}
	var replayed, changed int
	for _, n := range rep.Replay.Replayed {
		replayed += n
	}
	for _, n := range rep.Replay.Changed {
		changed += n
	}
	line := fmt.Sprintf("%s (session %s, %s, %.0f ms): host suite %d checks, %d slots answered, replay %d/%d changed, own tests %s (not authoritative)",
		verdict, v.Session, v.ValidatedAt.Local().Format("2006-01-02 15:04:05"), rep.TookMS, len(rep.Suite), len(rep.Slots), changed, replayed, own)
	for _, c := range rep.Replay.Changes {
		line += fmt.Sprintf("\n      changed %s #%d: %s -> %s%s", c.Slot, c.Invocation, c.Before, c.After, c.Error)
	}
	return line
}
