package provider

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Completer answers chat requests: a *Client, or a test's fake.
type Completer interface {
	Complete(ctx context.Context, req Request) (*Response, error)
}

// RouteInfo describes a route to the planner.
type RouteInfo struct {
	Name    string `json:"name"`
	Model   string `json:"model"`
	Dialect string `json:"dialect"`
	// Down is set while the route is resting after a transient failure;
	// DownSeconds says for how much longer.
	Down        bool    `json:"down"`
	DownSeconds float64 `json:"down_seconds,omitempty"`
}

// PlanInput is what the model.plan hook decides on.
type PlanInput struct {
	RequestMeta
	Routes []RouteInfo `json:"routes"`
	// Default is the host's plan: agent.route, then agent.fallback.
	Default []string `json:"default"`
}

// Plan is the order in which a step tries routes.
type Plan struct {
	Routes   []string `json:"routes"`
	Reason   string   `json:"reason"`
	Fallback bool     `json:"fallback"` // set when the host's default replaced a failed hook's answer
}

// Planner picks a step's routes: hooks.Dispatcher's model.plan. It always
// answers; on any failure of its own it returns the default plan.
type Planner interface {
	PlanModel(ctx context.Context, in PlanInput) Plan
}

// RouterOptions are a Router's routes and policy.
type RouterOptions struct {
	// Routes by name; Default lists the step order (agent.route, then
	// agent.fallback) and each must be in Routes.
	Routes  map[string]Completer
	Info    map[string]RouteInfo // model and dialect per route, for the planner
	Default []string
	// SessionDefault, if set, returns a session's own default plan (a child
	// agent's profile route, then its fallback), which replaces Default for
	// that session's requests, model.plan's "default" included; nil or
	// empty: Default. Its routes are checked at each request: one that is
	// not configured, or an error reading the plan, fails the request; it
	// never falls back to Default.
	SessionDefault func(session string) ([]string, error)
	Planner        Planner // nil: always the default plan
	// Rest is how long a route that failed transiently is passed over
	// (doubling per failure in a row up to MaxRest). Defaults 10 s, 5 min.
	Rest, MaxRest time.Duration
	Clock         func() time.Time
	Log           *slog.Logger
	// Observe is told of each request that failed and was followed by
	// another route (the caller observes the final answer itself).
	Observe func(route, outcome string, usage Usage)
	// PassedOn, if set, is told of each request a route failed and
	// passed on to the next with a (partial) response: it cost what it
	// reported, and no step records it (the spend ledger does).
	PassedOn func(meta RequestMeta, route string, resp *Response)
}

// Router sends each request to the first route of its plan that answers.
// A route that fails transiently (Error.Retryable) hands the request to the
// next one and rests for a while, so that the next steps do not wait on it;
// after its rest it is tried first again. A non-transient failure ends the
// request at once: another route would not make a bad request good. It is
// safe for concurrent use.
type Router struct {
	opts RouterOptions // Routes, Info and Default as built; the live ones are in table

	// table holds the routes in force: replaced whole by SetRoutes (a
	// reload of klbr.toml), read once per call, never changed in place.
	table atomic.Pointer[table]

	mu   sync.Mutex // guards rest
	rest map[string]resting
}

// table is a Router's routes: by name, their info and the default plan.
type table struct {
	routes map[string]Completer
	info   map[string]RouteInfo
	def    []string
}

type resting struct {
	until    time.Time
	failures int
}

// NewRouter returns a Router.
func NewRouter(opts RouterOptions) (*Router, error) {
	t, err := newTable(opts.Routes, opts.Info, opts.Default)
	if err != nil {
		return nil, err
	}
	if opts.Rest <= 0 {
		opts.Rest = 10 * time.Second
	}
	if opts.MaxRest <= 0 {
		opts.MaxRest = 5 * time.Minute
	}
	if opts.Clock == nil {
		opts.Clock = time.Now
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.Observe == nil {
		opts.Observe = func(string, string, Usage) {}
	}
	r := &Router{opts: opts, rest: map[string]resting{}}
	r.table.Store(t)
	return r, nil
}

func newTable(routes map[string]Completer, info map[string]RouteInfo, def []string) (*table, error) {
	if len(def) == 0 {
		return nil, errors.New("provider: a router needs at least one route")
	}
	for _, n := range def {
		if routes[n] == nil {
			return nil, fmt.Errorf("provider: route %q has no client", n)
		}
	}
	return &table{routes: maps.Clone(routes), info: maps.Clone(info), def: slices.Clone(def)}, nil
}

// SetRoutes replaces the routes and the default plan (a reload of
// klbr.toml): requests that already chose a route finish on it, the next
// ones plan with the new table. It is refused, and nothing changes, when
// a route of def has no client. A route that keeps its name keeps its rest.
func (r *Router) SetRoutes(routes map[string]Completer, info map[string]RouteInfo, def []string) error {
	t, err := newTable(routes, info, def)
	if err != nil {
		return err
	}
	r.table.Store(t)
	r.mu.Lock()
	defer r.mu.Unlock()
	for name := range r.rest {
		if t.routes[name] == nil {
			delete(r.rest, name)
		}
	}
	return nil
}

// Names returns the routes in force, sorted.
func (r *Router) Names() []string { return slices.Sorted(maps.Keys(r.table.Load().routes)) }

// Default returns the default plan in force: agent.route, then agent.fallback.
func (r *Router) Default() []string { return slices.Clone(r.table.Load().def) }

// Plan returns the routes a request with meta would try, in order, and
// why: the planner's answer, validated, or the default.
func (r *Router) Plan(ctx context.Context, meta RequestMeta) Plan {
	now := r.opts.Clock()
	t := r.table.Load()
	def, reason := t.def, "default: agent.route, then agent.fallback"
	own, err := r.sessionDefault(meta)
	if err != nil {
		return Plan{Reason: fmt.Sprintf("session %s's own routes cannot be read: %v", meta.Session, err)}
	}
	if len(own) > 0 {
		if err := t.check(Plan{Routes: own}); err != nil {
			// Never another route than the session's: no plan, and the
			// request fails saying why.
			return Plan{Reason: fmt.Sprintf("session %s's routes %v: %v", meta.Session, own, strings.TrimPrefix(err.Error(), "model.plan named "))}
		}
		def, reason = own, "default: the session's profile route, then its fallback"
	}
	if r.opts.Planner == nil || len(t.routes) == 1 {
		// With one route there is nothing to choose: the hook is not asked
		// (it would cost a hook round trip per step for nothing).
		return Plan{Routes: def, Reason: reason}
	}
	if meta.Purpose == "" {
		meta.Purpose = "turn"
	}
	in := PlanInput{RequestMeta: meta, Default: slices.Clone(def)}
	r.mu.Lock()
	for _, name := range slices.Sorted(maps.Keys(t.routes)) {
		info := t.info[name]
		info.Name = name
		if rs, ok := r.rest[name]; ok && now.Before(rs.until) {
			info.Down, info.DownSeconds = true, rs.until.Sub(now).Seconds()
		}
		in.Routes = append(in.Routes, info)
	}
	r.mu.Unlock()
	p := r.opts.Planner.PlanModel(ctx, in)
	if err := t.check(p); err != nil {
		return Plan{Routes: def, Reason: "default (" + err.Error() + ")", Fallback: true}
	}
	return p
}

// sessionDefault is the session's own default plan, if it has one; a
// route test (purpose "test") names its route itself.
func (r *Router) sessionDefault(meta RequestMeta) ([]string, error) {
	if r.opts.SessionDefault == nil || meta.Session == "" || meta.Purpose == "test" {
		return nil, nil
	}
	return r.opts.SessionDefault(meta.Session)
}

// Has reports whether every route of names is configured and usable.
func (r *Router) Has(names ...string) error {
	t := r.table.Load()
	for _, n := range names {
		if t.routes[n] == nil {
			return fmt.Errorf("route %q is not configured (or cannot be used) in the running klbr.toml", n)
		}
	}
	return nil
}

// CheckPlan validates a plan: one to 8 known routes, none twice.
func (r *Router) CheckPlan(p Plan) error { return r.table.Load().check(p) }

func (t *table) check(p Plan) error {
	if len(p.Routes) == 0 || len(p.Routes) > 8 {
		return fmt.Errorf("model.plan named %d routes; 1 to 8", len(p.Routes))
	}
	seen := map[string]bool{}
	for _, n := range p.Routes {
		if t.routes[n] == nil {
			return fmt.Errorf("model.plan named route %q, which is not configured", n)
		}
		if seen[n] {
			return fmt.Errorf("model.plan named route %q twice", n)
		}
		seen[n] = true
	}
	return nil
}

// Complete sends req along its plan. The Response, and an *Error, carry the
// name of the route that answered or failed last.
func (r *Router) Complete(ctx context.Context, req Request) (*Response, error) {
	t := r.table.Load()
	plan := r.Plan(ctx, req.Meta)
	if len(plan.Routes) == 0 {
		return nil, fmt.Errorf("provider: no route to send along: %s", plan.Reason)
	}
	order := r.order(plan.Routes)
	var resp *Response
	var err error
	for i, name := range order {
		c := t.routes[name]
		if c == nil {
			// A reload between the plan and this step took the route away.
			return resp, fmt.Errorf("provider: route %q is no longer configured", name)
		}
		resp, err = c.Complete(ctx, req)
		if resp != nil {
			resp.Route = name
		}
		var pe *Error
		if errors.As(err, &pe) {
			pe.Route = name
		}
		if err == nil {
			r.recovered(name)
			return resp, nil
		}
		if ctx.Err() != nil || !IsRetryable(err) {
			return resp, err
		}
		r.failed(name)
		if i+1 < len(order) {
			var usage Usage
			if resp != nil {
				usage = resp.Usage
			}
			outcome := "error"
			if pe != nil {
				outcome = "error_" + pe.Kind.String()
			}
			r.opts.Observe(name, outcome, usage)
			if resp != nil && r.opts.PassedOn != nil {
				r.opts.PassedOn(req.Meta, name, resp)
			}
			r.opts.Log.Warn("model route failed; the step goes to the next route", "route", name, "next", order[i+1], "error", err.Error())
		}
	}
	return resp, err
}

// order puts the resting routes of plan after the others (in plan order
// both); a plan whose every route rests is tried as it is.
func (r *Router) order(plan []string) []string {
	now := r.opts.Clock()
	r.mu.Lock()
	defer r.mu.Unlock()
	var up, down []string
	for _, n := range plan {
		if rs, ok := r.rest[n]; ok && now.Before(rs.until) {
			down = append(down, n)
		} else {
			up = append(up, n)
		}
	}
	return append(up, down...)
}

// Resting returns, for every route, the seconds it still rests (0: up).
func (r *Router) Resting() map[string]float64 {
	now := r.opts.Clock()
	r.mu.Lock()
	defer r.mu.Unlock()
	t := r.table.Load()
	out := make(map[string]float64, len(t.routes))
	for name := range t.routes {
		out[name] = 0
		if rs, ok := r.rest[name]; ok && now.Before(rs.until) {
			out[name] = rs.until.Sub(now).Seconds()
		}
	}
	return out
}

func (r *Router) failed(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	rs := r.rest[name]
	rs.failures++
	d := r.opts.Rest << min(rs.failures-1, 20)
	rs.until = r.opts.Clock().Add(min(d, r.opts.MaxRest))
	r.rest[name] = rs
}

func (r *Router) recovered(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.rest, name)
}
