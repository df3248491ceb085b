package cli

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/klbr-dev/klbr/internal/provider"
)

func newRoute(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "route",
		Short: "Work with the model routes of klbr.toml",
		Args:  cobra.NoArgs,
	}
	cmd.AddCommand(newRouteTest(g))
	return cmd
}

// routeTest is what route test prints with --json.
type routeTest struct {
	Route          string         `json:"route"`
	URL            string         `json:"url"`
	Model          string         `json:"model"`
	Dialect        string         `json:"dialect"`
	Reply          string         `json:"reply"`
	Reasoning      string         `json:"reasoning,omitempty"`
	ReasoningField string         `json:"reasoning_field,omitempty"`
	FinishReason   string         `json:"finish_reason"`
	Usage          map[string]int `json:"usage"` // the counts the provider reported, by name
	LatencyMillis  int64          `json:"latency_ms"`
	FirstMillis    *int64         `json:"first_delta_ms,omitempty"`
}

func newRouteTest(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "test NAME",
		Short: "Send one small tool-free request to a route and print the reply, usage and latency (it may cost money)",
		Long: "Sends one streaming request, without tools, to [routes.NAME] exactly as the agent would (its dialect,\n" +
			"key and options), straight from this process: no daemon is needed. The request costs what a\n" +
			"few dozen tokens cost on the route.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := g.config()
			if err != nil {
				return err
			}
			name := args[0]
			r, ok := cfg.File.Routes[name]
			if !ok {
				names := slices.Sorted(maps.Keys(cfg.File.Routes))
				return fmt.Errorf("route test: no [routes.%s] in %s (routes: %s)", name, cfg.Paths.ConfigFile, strings.Join(names, ", "))
			}
			lg, err := g.logger()
			if err != nil {
				return err
			}
			c, err := provider.New(r, provider.Options{LookupEnv: g.env.Lookup, Logger: lg.With("component", "provider", "route", name)})
			if err != nil {
				return fmt.Errorf("route test %s: %w", name, err)
			}
			out := routeTest{Route: name, URL: c.Endpoint(), Model: r.Model, Dialect: c.Dialect().Name, Usage: map[string]int{}}
			start := time.Now()
			req := provider.Request{Stream: true, Meta: provider.RequestMeta{Purpose: "test"},
				Messages: []provider.Message{{Role: "system", Content: "You are being tested. Answer in one short sentence."},
					{Role: "user", Content: "Say hello and name the model you are."}},
				OnDelta: func(provider.Delta) {
					if out.FirstMillis == nil {
						ms := time.Since(start).Milliseconds()
						out.FirstMillis = &ms
					}
				}}
			resp, err := c.Complete(cmd.Context(), req)
			out.LatencyMillis = time.Since(start).Milliseconds()
			if err != nil {
				var pe *provider.Error
				if errors.As(err, &pe) && !pe.Retryable() {
					return fmt.Errorf("route test %s: %w (after %d ms)", name, err, out.LatencyMillis)
				}
				return fmt.Errorf("route test %s: %w (after %d ms; transient: try again)", name, err, out.LatencyMillis)
			}
			out.Reply, out.Reasoning, out.ReasoningField, out.FinishReason = resp.Content, resp.Reasoning, resp.ReasoningField, resp.FinishReason
			for k, p := range map[string]*int{"prompt": resp.Usage.PromptTokens, "completion": resp.Usage.CompletionTokens,
				"total": resp.Usage.TotalTokens, "cache_read": resp.Usage.CacheReadTokens, "cache_write": resp.Usage.CacheWriteTokens,
				"cache_miss": resp.Usage.CacheMissTokens} {
				if p != nil {
					out.Usage[k] = *p
				}
			}
			if asJSON {
				return printJSON(g.env.Stdout, out)
			}
			w := g.env.Stdout
			fmt.Fprintf(w, "route %s: %s, model %s, dialect %s\n", name, out.URL, out.Model, out.Dialect)
			fmt.Fprintf(w, "reply: %s\n", strings.TrimSpace(out.Reply))
			if out.Reasoning != "" {
				fmt.Fprintf(w, "reasoning (%s): %s\n", out.ReasoningField, excerpt(out.Reasoning, 200))
			}
			var usage []string
			for _, k := range []string{"prompt", "completion", "total", "cache_read", "cache_write", "cache_miss"} {
				if n, ok := out.Usage[k]; ok {
					usage = append(usage, fmt.Sprintf("%s %d", k, n))
				}
			}
			if len(usage) == 0 {
				usage = []string{"not reported"}
			}
			fmt.Fprintf(w, "usage: %s\n", strings.Join(usage, ", "))
			first := ""
			if out.FirstMillis != nil {
				first = fmt.Sprintf(", first delta after %d ms", *out.FirstMillis)
			}
			fmt.Fprintf(w, "latency: %d ms%s; finish_reason %s\n", out.LatencyMillis, first, out.FinishReason)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print as JSON")
	return cmd
}

func excerpt(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	r := []rune(s)
	if len(r) > n {
		return string(r[:n]) + "…"
	}
	return s
}
