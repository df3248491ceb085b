package config

import (
	"fmt"
	"strings"
)

// SeedURLs are seed 000's default model endpoints: OpenAI-compatible
// servers on this machine. With no route configured, agent.route goes to
// the first and falls back to the others in order.
var SeedURLs = []string{"http://localhost:8001/v1", "http://localhost:8002/v1", "http://localhost:8003/v1"}

// applySeed puts the seed's default routes in force when f configures no
// route at all (no [routes], no agent.fallback, no agent.summary_route):
// agent.route at SeedURLs[0], routes seed-8002 and seed-8003 as its
// fallbacks. They carry no model name: the request leaves "model" out and
// the server answers with the model it serves (llama.cpp's llama-server,
// vLLM with one served model). configFile is where a route is configured
// instead, named in what the routes say when nothing answers.
func (f *File) applySeed(configFile string) {
	if len(f.Routes) != 0 || len(f.Agent.Fallback) != 0 || f.Agent.SummaryRoute != "" {
		return
	}
	f.SeedRoutes = true
	f.Routes = map[string]Route{}
	for i, url := range SeedURLs {
		name := f.Agent.Route
		if i > 0 {
			name = "seed-" + strings.TrimSuffix(strings.TrimPrefix(url, "http://localhost:"), "/v1")
			f.Agent.Fallback = append(f.Agent.Fallback, name)
		}
		f.Routes[name] = Route{URL: url, TimeoutSeconds: DefaultRouteTimeoutSeconds,
			Seed: fmt.Sprintf("no route is configured and nothing answers at this seed default: start an OpenAI-compatible server there "+
				"(e.g. llama-server or vLLM on %s), or configure [routes.%s] (url, model) in %s and run klbr-core reload",
				strings.TrimSuffix(strings.TrimPrefix(url, "http://"), "/v1"), f.Agent.Route, configFile)}
	}
}

// SeedNote is the line the banner, status and doctor show while the seed's
// default routes are in force; "" when a route is configured.
func (f *File) SeedNote(configFile string) string {
	if !f.SeedRoutes {
		return ""
	}
	return fmt.Sprintf("no route configured: using seed defaults %s (then %s); configure [routes.%s] in %s to choose",
		SeedURLs[0], strings.Join(SeedURLs[1:], ", "), f.Agent.Route, configFile)
}
