package doctor

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/klbr-dev/klbr/internal/config"
	"github.com/klbr-dev/klbr/internal/provider"
)

// checkRoutes checks every [routes.X]: its key can be read, its server
// answers GET {url}/models, and it lists the route's model. Each problem is
// a FAIL or WARN line that names the route.
func checkRoutes(ctx context.Context, cfg *config.Config, lookup func(string) (string, bool), add func(Check)) {
	f := &cfg.File
	if len(f.Routes) == 0 {
		add(Check{Name: "route", OK: true, Warn: true, Detail: fmt.Sprintf("no [routes.%s] in %s: the agent does not run", f.Agent.Route, cfg.Paths.ConfigFile),
			Fix: "add a route (docs/agent.md, \"Model routes\")"})
		return
	}
	if note := f.SeedNote(cfg.Paths.ConfigFile); note != "" {
		add(Check{Name: "route", OK: true, Warn: true, Detail: note,
			Fix: fmt.Sprintf("to choose the model, add [routes.%s] (url, model) to %s (docs/agent.md, \"Model routes\")", f.Agent.Route, cfg.Paths.ConfigFile)})
	}
	role := map[string]string{f.Agent.Route: "agent route"}
	for i, n := range f.Agent.Fallback {
		role[n] = fmt.Sprintf("fallback %d", i+1)
	}
	if s := f.Agent.SummaryRoute; s != "" && role[s] == "" {
		role[s] = "summary route"
	}
	for _, r := range profileRoutes(cfg) {
		if role[r] == "" {
			role[r] = "a profile's route"
		}
	}
	for _, name := range slices.Sorted(maps.Keys(f.Routes)) {
		r := f.Routes[name]
		label := name
		if role[name] != "" {
			label += " (" + role[name] + ")"
		}
		c := checkRoute(ctx, label, r, lookup)
		if r.Seed != "" && !c.OK {
			// A seed default nobody chose that does not answer is a
			// warning, as no route at all was: serve starts, inputs are
			// kept, and the line says what to start or configure.
			c.OK, c.Warn = true, true
		}
		if role[name] == "" {
			// Nothing sends to it: what its server does is worth a look,
			// never a failure.
			c.OK, c.Warn = true, true
			c.Detail += "; nothing uses it (not agent.route, a fallback, agent.summary_route or a profile's route)"
			if c.Fix == "" {
				c.Fix = "remove it, or name it where it should be used"
			}
		}
		add(c)
	}
}

func checkRoute(ctx context.Context, label string, r config.Route, lookup func(string) (string, bool)) Check {
	c := Check{Name: "route"}
	client, err := provider.New(r, provider.Options{LookupEnv: lookup})
	if err != nil {
		c.Detail = label + ": " + strings.TrimPrefix(err.Error(), "provider: ")
		c.Fix = "set the variable in the daemon's environment, or correct api_key_env / api_key_file"
		return c
	}
	d := client.Dialect().Name
	models, err := client.Models(ctx)
	var pe *provider.Error
	errors.As(err, &pe)
	switch {
	case err == nil:
	case pe != nil && pe.Kind == provider.KindHTTP && (pe.Status == 401 || pe.Status == 403):
		c.Detail = fmt.Sprintf("%s: the server refused the key: %v", label, err)
		c.Fix = "check the key the route names (api_key_env / api_key_file)"
		return c
	case pe != nil && pe.Kind == provider.KindHTTP && (pe.Status == 404 || pe.Status == 405):
		c.OK, c.Warn = true, true
		c.Detail = fmt.Sprintf("%s: %s (%s) answers, but does not list models at %s/models; the model is not checked", label, r.URL, d, strings.TrimRight(r.URL, "/"))
		c.Fix = "if requests fail with 404, check that url is the API's base (…/v1)"
		return c
	case pe != nil && (pe.Kind == provider.KindNetwork || pe.Kind == provider.KindTimeout) && r.Seed != "":
		c.Detail = fmt.Sprintf("%s: nothing answers at %s (a seed default)", label, r.URL)
		c.Fix = r.Seed
		return c
	case pe != nil && (pe.Kind == provider.KindNetwork || pe.Kind == provider.KindTimeout):
		c.Detail = fmt.Sprintf("%s: the server does not answer: %v", label, err)
		c.Fix = "start the model server, or correct the route's url"
		return c
	default:
		c.OK, c.Warn = true, true
		c.Detail = fmt.Sprintf("%s: could not read the model list: %v", label, err)
		return c
	}
	if r.Model == "" { // a seed default: the request names no model
		c.OK = true
		c.Detail = fmt.Sprintf("%s: %s answers (%s); a seed default, the request names no model: the server's own answers (it lists: %s)",
			label, r.URL, d, strings.Join(models[:min(len(models), 8)], ", "))
		return c
	}
	if slices.Contains(models, r.Model) {
		c.OK = true
		c.Detail = fmt.Sprintf("%s: %s serves %s (%s)", label, r.URL, r.Model, d)
		return c
	}
	listed := strings.Join(models[:min(len(models), 8)], ", ")
	if len(models) > 8 {
		listed += fmt.Sprintf(", … (%d in all)", len(models))
	}
	if listed == "" {
		listed = "none"
	}
	c.Detail = fmt.Sprintf("%s: %s does not list model %q (it lists: %s)", label, r.URL, r.Model, listed)
	c.Fix = "set the route's model to one the server lists"
	if d == config.DialectLlamaCpp {
		// llama-server answers with the model it loaded, whatever the
		// request names.
		c.OK, c.Warn = true, true
		c.Fix = "llama.cpp serves the model it loaded whatever the name; set model to its alias to keep records clear"
	}
	return c
}
