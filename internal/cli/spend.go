package cli

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/klbr-dev/klbr/internal/api"
	"github.com/klbr-dev/klbr/internal/spend"
)

func newSpend(g *globals) *cobra.Command {
	var by, since string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "spend",
		Short: "Show what model requests cost: the ledger by day, route, session, tree or purpose, and the caps",
		Long: "Reads the spend ledger of the running daemon: every model request's tokens and cost (the provider's\n" +
			"reported cost, else the route's price; a route with neither counts tokens only).\n" +
			"--since takes a date (2026-05-01), an RFC 3339 time, or a duration back from now (36h, 7d).",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			t, err := parseSince(since, time.Now())
			if err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			out, err := c.Spend(cmd.Context(), by, t)
			if err != nil {
				return fmt.Errorf("spend: %w", err)
			}
			if asJSON {
				return printJSON(g.env.Stdout, out)
			}
			printSpend(g, out)
			return nil
		},
	}
	cmd.Flags().StringVar(&by, "by", "day", "group by day, route, session, tree or purpose")
	cmd.Flags().StringVar(&since, "since", "30d", "from when: a date, an RFC 3339 time, or a duration back (7d, 36h)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print as JSON")
	cmd.AddCommand(newSpendCap(g))
	return cmd
}

func newSpendCap(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "cap daily|monthly AMOUNT",
		Short: "Set the daily or monthly spend cap in USD (kept across restarts; sessions held at the cap resume at once if it is raised)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			usd, err := strconv.ParseFloat(strings.TrimPrefix(args[1], "$"), 64)
			if err != nil {
				return fmt.Errorf("spend cap: %q is not an amount in USD (e.g. 5.00)", args[1])
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			out, err := c.SetSpendCap(cmd.Context(), args[0], usd)
			if err != nil {
				return fmt.Errorf("spend cap: %w", err)
			}
			if asJSON {
				return printJSON(g.env.Stdout, out)
			}
			fmt.Fprintf(g.env.Stdout, "%s cap set to $%.2f\n", args[0], usd)
			if out.State != nil {
				printSpendState(g, out.State)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print as JSON")
	return cmd
}

// parseSince reads --since: a date, an RFC 3339 time, or a duration back
// from now (with a d suffix for days); "" is the whole ledger.
func parseSince(s string, now time.Time) (time.Time, error) {
	switch {
	case s == "":
		return time.Time{}, nil
	case strings.HasSuffix(s, "d"):
		if n, err := strconv.Atoi(strings.TrimSuffix(s, "d")); err == nil && n >= 0 && n <= 36600 {
			return now.AddDate(0, 0, -n), nil
		}
	}
	if d, err := time.ParseDuration(s); err == nil && d >= 0 {
		return now.Add(-d), nil
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	if t, err := time.ParseInLocation(time.DateOnly, s, time.Local); err == nil {
		return t, nil
	}
	return time.Time{}, fmt.Errorf("spend: --since %q is not a date (2026-05-01), an RFC 3339 time or a duration (7d, 36h)", s)
}

func printSpend(g *globals, out api.Spend) {
	w := g.env.Stdout
	fmt.Fprintf(w, "%-24s %8s %12s %12s %10s\n", strings.ToUpper(out.By), "REQUESTS", "TOKENS", "CACHED", "USD")
	for _, r := range out.Groups {
		key := r.Key
		if key == "" {
			key = "-"
		}
		note := ""
		if r.Unpriced > 0 {
			note = fmt.Sprintf("  (%d in tokens only)", r.Unpriced)
		}
		fmt.Fprintf(w, "%-24s %8d %12d %12d %10.4f%s\n", key, r.Requests, r.Tokens, r.Cached, r.USD, note)
	}
	t := out.Total
	fmt.Fprintf(w, "%-24s %8d %12d %12d %10.4f\n", "total", t.Requests, t.Tokens, t.Cached, t.USD)
	if out.State != nil {
		printSpendState(g, out.State)
	}
}

func printSpendState(g *globals, s *spend.State) {
	w := g.env.Stdout
	capOf := func(p *float64) string {
		if p == nil {
			return "no cap"
		}
		return fmt.Sprintf("cap $%.2f", *p)
	}
	fmt.Fprintf(w, "today: $%.4f (%s), %d tokens", s.DayUSD, capOf(s.DailyUSD), s.DayTokens)
	if s.DailyTokens > 0 {
		fmt.Fprintf(w, " (cap %d)", s.DailyTokens)
	}
	fmt.Fprintf(w, "; this month: $%.4f (%s); time zone %s\n", s.MonthUSD, capOf(s.MonthlyUSD), s.TimeZone)
	for _, h := range s.Held {
		fmt.Fprintf(w, "session %s: %s\n", h.Session, h)
	}
}
