package cli

import (
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/klbr-dev/klbr/internal/api"
	"github.com/klbr-dev/klbr/internal/store"
)

func newStatus(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status [SESSION]",
		Short: "Show the daemon's state, or one session's",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			if len(args) == 1 {
				s, err := c.Session(cmd.Context(), args[0])
				if err != nil {
					return err
				}
				if asJSON {
					return printJSON(g.env.Stdout, s)
				}
				printSessions(g, []api.SessionStatus{s})
				return nil
			}
			st, err := c.Status(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(g.env.Stdout, st)
			}
			state := "serving"
			if st.Draining {
				state = "draining"
			}
			fmt.Fprintf(g.env.Stdout, "klbr-core %s: %s, pid %d, up %s\n", st.Version, state, st.PID, time.Since(st.StartedAt).Round(time.Second))
			wb := st.Workbench
			if st.WorkbenchHost != "" {
				wb += " on host " + st.WorkbenchHost
			}
			fmt.Fprintf(g.env.Stdout, "data %s · sqlite %s · placement %s · workbench %s\n", st.DataDir, st.SQLite, st.Placement, wb)
			for _, l := range st.WorkbenchLost {
				fmt.Fprintf(g.env.Stdout, "workbench of %s: generation %d LOST at %s (the next cell runs in a new generation): %s\n", l.Session, l.Generation,
					l.At.Local().Format(time.DateTime), oneLine(l.Reason, 300))
			}
			fmt.Fprintf(g.env.Stdout, "agent: %s\n", st.Agent)
			fmt.Fprintf(g.env.Stdout, "storage: database %s, wal %s, artifacts %s, releases %s · schema %d (%s)\n",
				mib(st.Sizes.Database), mib(st.Sizes.WAL), mib(st.Sizes.Artifacts), mib(st.Sizes.Releases), st.Schema.Version, downgrade(st.Schema))
			if u := st.Usage; u.Max > 0 {
				note := ""
				if u.Headroom == 0 {
					note = " · AT THE BOUND: new artifacts are refused (inputs are still admitted); run klbr-core gc or raise [storage] max_bytes"
				} else if u.Warn {
					note = fmt.Sprintf(" · past warn_at %.2f: klbr-core collects under [retention] by itself", u.WarnAt)
				}
				fmt.Fprintf(g.env.Stdout, "storage bound: %s used of %s, %s headroom%s\n", mib(u.Used), mib(u.Max), mib(u.Headroom), note)
			}
			if f := st.Storage; f != nil {
				fmt.Fprintf(g.env.Stdout, "storage: FAILING since %s: %s; new work waits, and klbr-core goes on by itself once writes succeed\n",
					f.Since.Local().Format(time.DateTime), f.Reason)
			}
			for _, r := range st.Routes {
				if r.RestingSeconds > 0 {
					fmt.Fprintf(g.env.Stdout, "route %s: resting for %s after a transient failure; steps go to the next route of the plan, and it is tried first again after that\n",
						r.Name, time.Duration(r.RestingSeconds*float64(time.Second)).Round(time.Second))
				}
			}
			for _, c := range st.PromptCache {
				fmt.Fprintf(g.env.Stdout, "route %s: prompt cache %.1f %% of today's %d prompt tokens\n", c.Route, 100*c.HitRatio, c.Prompt)
			}
			for _, n := range st.PlacementNotes {
				fmt.Fprintf(g.env.Stdout, "  (placement skipped %s)\n", n)
			}
			if st.Sandbox != "" {
				fmt.Fprintf(g.env.Stdout, "sandbox: %s\n", st.Sandbox)
			}
			if st.Held > 0 {
				printHeld(g, st)
			}
			printJobsStatus(g, st.Jobs)
			fmt.Fprintln(g.env.Stdout)
			printSessions(g, st.Sessions)
			printHooks(g, st.Hooks)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print as JSON")
	return cmd
}

func printSessions(g *globals, ss []api.SessionStatus) {
	tw := tabwriter.NewWriter(g.env.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SESSION\tSTATE\tPENDING\tKERNEL\tBEHAVIOR\tRELEASE\tSINCE")
	for _, s := range ss {
		state := string(s.State)
		if s.Draining {
			state += " (draining)"
		}
		rev := s.PolicyRevision
		if len(rev) > 12 {
			rev = rev[:12]
		} else if rev == "" {
			rev = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%s\t%s\n", s.ID, state, s.Pending, s.KernelGen, s.BehaviorEpoch, rev, s.UpdatedAt.Local().Format(time.DateTime))
	}
	tw.Flush()
	said := map[string]string{} // an error's text -> the session that said it first
	for _, s := range ss {
		lastErr := ""
		if s.Retry != nil {
			lastErr = s.Retry.LastError
		}
		if s.StateReason != "" && (s.State == "paused" || s.State == "stopped") {
			fmt.Fprintf(g.env.Stdout, "%s %s: %s; it waits for `klbr-core start %s`\n", s.ID, s.State, s.StateReason, s.ID)
		}
		if a := s.Attempt; a != nil {
			fmt.Fprintf(g.env.Stdout, "%s attempt %d: %s after %d steps, %d tokens (woke by: %s)", s.ID, a.ID, a.State, a.Steps, a.Tokens, withoutError(a.WakeReason, lastErr))
			if rel := a.Release; rel != "" {
				fmt.Fprintf(g.env.Stdout, " under release %.12s", rel)
			}
			if o := withoutError(a.Outcome, lastErr); o != "" {
				fmt.Fprintf(g.env.Stdout, "; %s", o)
			}
			fmt.Fprintln(g.env.Stdout)
		}
		if c := s.Context; c != nil {
			fmt.Fprintf(g.env.Stdout, "%s context: epoch %d, %d entries (%d summaries) over %d records", s.ID, c.Epoch, c.Entries, c.Summaries, c.Items)
			if st := c.ContextState; st != nil {
				fmt.Fprintf(g.env.Stdout, "; last request about %d of %d tokens (compacts past %d; calibration %.2f), %d compactions",
					st.Tokens, st.Budget, st.Threshold, st.Factor, st.Compactions)
				if st.Degraded > 0 {
					fmt.Fprintf(g.env.Stdout, " (%d degraded)", st.Degraded)
				}
			}
			fmt.Fprintln(g.env.Stdout)
		}
		if r := s.Retry; r != nil {
			next := "now"
			if d := time.Until(r.NextAt); d > 0 {
				next = "in " + d.Round(100*time.Millisecond).String()
			}
			switch r.State {
			case "retrying":
				fmt.Fprintf(g.env.Stdout, "%s retrying by itself %s (%d failed in a row); last error at %s", s.ID, next, r.InARow, r.LastErrorAt.Local().Format(time.DateTime))
			case "waiting_for_slot":
				fmt.Fprintf(g.env.Stdout, "%s waits for a model request slot since %s", s.ID, r.NextAt.Local().Format(time.DateTime))
			case "spend_cap":
				fmt.Fprintf(g.env.Stdout, "%s holds its next model request since %s", s.ID, r.LastErrorAt.Local().Format(time.DateTime))
			default:
				fmt.Fprintf(g.env.Stdout, "%s backing off: the next input starts an attempt %s (%d in a row); last at %s", s.ID, next, r.InARow, r.LastErrorAt.Local().Format(time.DateTime))
			}
			if r.URL != "" {
				fmt.Fprintf(g.env.Stdout, " (route %s, %s)", r.Route, r.URL)
			}
			if first, ok := said[r.LastError]; ok && r.LastError != "" {
				fmt.Fprintf(g.env.Stdout, ": the same error as %s\n", first)
			} else {
				said[r.LastError] = s.ID
				fmt.Fprintf(g.env.Stdout, ": %s\n", r.LastError)
				if r.Fix != "" {
					fmt.Fprintf(g.env.Stdout, "%s   fix: %s\n", s.ID, r.Fix)
				}
			}
		}
		if w := s.Wait; w != nil {
			until := "until input"
			if w.Deadline != nil {
				until = "until input or " + w.Deadline.Local().Format(time.DateTime) + " (" + time.Until(*w.Deadline).Round(time.Second).String() + ")"
			}
			fmt.Fprintf(g.env.Stdout, "%s waits %s: %s\n", s.ID, until, w.Reason)
		}
	}
}

// printHeld says that held sends wait for a person, since when, and what
// ends the wait: nothing but the operator's decision.
func printHeld(g *globals, st api.Status) {
	since := ""
	if st.HeldSince != nil {
		since = fmt.Sprintf(" (the oldest since %s, %s)", st.HeldSince.Local().Format(time.DateTime), time.Since(*st.HeldSince).Round(time.Second))
	}
	fmt.Fprintf(g.env.Stdout, "discord: %d held send(s) or reaction(s) wait for a person%s; only a decision ends the wait: "+
		"klbr-core held, then klbr-core release EFFECT or klbr-core drop EFFECT (or the browser's Held sends, or the buttons of the operator's Discord DM)\n",
		st.Held, since)
}

// withoutError is text (an attempt's outcome, what woke it) without the
// error the retry line below names: cut before the clause that carries it,
// so status says each error once.
func withoutError(text, err string) string {
	i := strings.Index(text, err)
	if err == "" || i < 0 {
		return text
	}
	head := text[:i]
	if j := strings.Index(head, " ("); j >= 0 {
		head = head[:j]
	}
	head = strings.TrimRight(head, " :;,(")
	return head + " (the error below)"
}

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

// downgrade says whether the previous klbr-core could still run on the schema.
func downgrade(s store.SchemaStatus) string {
	if s.Downgrade {
		return fmt.Sprintf("a klbr-core of schema %d can still run on it", s.ReadableBy)
	}
	return "no downgrade: an older klbr-core refuses it; restore a backup to go back"
}

// printHooks prints the slots that were called or fell back, every observer
// binding, and the loop limits.
func printHooks(g *globals, h *api.HooksStatus) {
	if h == nil {
		return
	}
	fmt.Fprintln(g.env.Stdout)
	fmt.Fprintf(g.env.Stdout, "hooks: observer loop limits: causal depth %d, %d commands per %gs per session\n",
		h.Limits.MaxDepth, h.Limits.Quota, h.Limits.WindowSeconds)
	tw := tabwriter.NewWriter(g.env.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SLOT\tCALLS\tFALLBACKS\tFAILED\tDEFAULTED\tMEAN")
	for _, s := range h.Slots {
		if s.Invocations == 0 && s.Skipped == 0 {
			continue
		}
		mean := time.Duration(0)
		if s.Invocations > 0 {
			mean = s.Latency / time.Duration(s.Invocations)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%s\n", s.Slot, s.Invocations, s.Fallbacks, s.Failures, s.Skipped, mean.Round(time.Microsecond))
	}
	tw.Flush()
	for _, o := range h.Observers {
		fmt.Fprintf(g.env.Stdout, "%s observer %s: backlog %d, done %d, dead letters %d, commands %d (%d refused by the loop limits)",
			o.Session, o.Handler, o.Backlog, o.Done, o.DeadLetters, o.Commands, o.Refused)
		if o.Paused != "" {
			fmt.Fprintf(g.env.Stdout, "; PAUSED: %s", o.Paused)
		}
		fmt.Fprintln(g.env.Stdout)
	}
}
