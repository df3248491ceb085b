package provider

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/config"
	"github.com/klbr-dev/klbr/internal/modeltest"
)

type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func client(t *testing.T, url string) *Client {
	t.Helper()
	c, err := New(config.Route{URL: url, Model: "fake", TimeoutSeconds: 5}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestRouterFallback: the main route goes down, the fallback answers and
// each step says so; while main rests, steps go straight to the fallback;
// after its rest main is tried again and, back up, answers again.
func TestRouterFallback(t *testing.T) {
	main := modeltest.New()
	t.Cleanup(main.Close)
	local := modeltest.New()
	t.Cleanup(local.Close)
	main.Otherwise(func(int) modeltest.Reply { return modeltest.Reply{Text: "from main"} })
	local.Otherwise(func(int) modeltest.Reply { return modeltest.Reply{Text: "from local"} })
	clock := &fakeClock{now: time.Unix(1000, 0)}
	var observed []string
	r, err := NewRouter(RouterOptions{
		Routes:  map[string]Completer{"main": client(t, main.URL()), "local": client(t, local.URL())},
		Default: []string{"main", "local"}, Clock: clock.Now, Rest: 10 * time.Second,
		Observe: func(route, outcome string, _ Usage) { observed = append(observed, route+":"+outcome) },
	})
	if err != nil {
		t.Fatal(err)
	}
	step := func() (*Response, error) {
		return r.Complete(context.Background(), Request{Messages: userMsg("x"), Stream: true})
	}
	if resp, err := step(); err != nil || resp.Route != "main" || resp.Content != "from main" {
		t.Fatalf("up: %+v %v", resp, err)
	}
	// Main fails transiently (503): the step goes to local.
	main.Then(modeltest.Reply{Status: 503, Body: `{"error":{"message":"overloaded"}}`})
	if resp, err := step(); err != nil || resp.Route != "local" || resp.Content != "from local" {
		t.Fatalf("main down: %+v %v", resp, err)
	}
	if len(observed) != 1 || observed[0] != "main:error_http" {
		t.Errorf("observed %v", observed)
	}
	// While main rests it is not asked.
	before := main.Count()
	for i := 0; i < 3; i++ {
		if resp, err := step(); err != nil || resp.Route != "local" {
			t.Fatalf("resting: %+v %v", resp, err)
		}
	}
	if main.Count() != before {
		t.Errorf("main asked %d times while resting", main.Count()-before)
	}
	if rest := r.Resting(); rest["main"] != 10 || rest["local"] != 0 {
		t.Errorf("resting %v", rest)
	}
	// After the rest, main answers again and steps return to it.
	clock.Add(11 * time.Second)
	if resp, err := step(); err != nil || resp.Route != "main" {
		t.Fatalf("main back: %+v %v", resp, err)
	}
}

// TestRouterRestDoubles: a route that keeps failing rests longer each time,
// up to MaxRest; when every route rests, they are tried anyway.
func TestRouterRestDoubles(t *testing.T) {
	down := modeltest.New()
	url := down.URL()
	down.Close() // connection refused
	clock := &fakeClock{now: time.Unix(1000, 0)}
	r, _ := NewRouter(RouterOptions{Routes: map[string]Completer{"main": client(t, url)}, Default: []string{"main"},
		Clock: clock.Now, Rest: time.Second, MaxRest: 3 * time.Second})
	for i, want := range []time.Duration{time.Second, 2 * time.Second, 3 * time.Second, 3 * time.Second} {
		_, err := r.Complete(context.Background(), Request{Messages: userMsg("x")})
		e := asError(t, err)
		if e.Kind != KindNetwork || e.Route != "main" || !strings.Contains(err.Error(), "(route main) to "+url) {
			t.Fatalf("%d: %v", i, err)
		}
		if got := r.rest["main"].until.Sub(clock.Now()); got != want {
			t.Errorf("failure %d: rests %v, want %v", i+1, got, want)
		}
	}
}

// TestRouterNonTransient: a 400 ends the step at once; the fallback is not
// asked (another route would not make a bad request good).
func TestRouterNonTransient(t *testing.T) {
	main := modeltest.New()
	t.Cleanup(main.Close)
	local := modeltest.New()
	t.Cleanup(local.Close)
	main.Then(modeltest.Reply{Status: 400, Body: `{"error":{"message":"bad request","code":"invalid_request_error"}}`})
	r, _ := NewRouter(RouterOptions{Routes: map[string]Completer{"main": client(t, main.URL()), "local": client(t, local.URL())},
		Default: []string{"main", "local"}})
	_, err := r.Complete(context.Background(), Request{Messages: userMsg("x")})
	if e := asError(t, err); e.Status != 400 || e.Route != "main" || local.Count() != 0 {
		t.Fatalf("%v; local asked %d", err, local.Count())
	}
	if !strings.Contains(err.Error(), "bad request (code invalid_request_error)") {
		t.Errorf("provider message: %v", err)
	}
}

type planner func(PlanInput) Plan

func (p planner) PlanModel(_ context.Context, in PlanInput) Plan { return p(in) }

// TestRouterPlan: a planner's valid plan is followed; an invalid one is
// replaced by the default, and says why.
func TestRouterPlan(t *testing.T) {
	a, b := modeltest.New(), modeltest.New()
	t.Cleanup(a.Close)
	t.Cleanup(b.Close)
	a.Otherwise(func(int) modeltest.Reply { return modeltest.Reply{Text: "a"} })
	b.Otherwise(func(int) modeltest.Reply { return modeltest.Reply{Text: "b"} })
	var seen PlanInput
	answer := Plan{Routes: []string{"cheap"}, Reason: "summaries go cheap"}
	r, _ := NewRouter(RouterOptions{Routes: map[string]Completer{"main": client(t, a.URL()), "cheap": client(t, b.URL())},
		Info:    map[string]RouteInfo{"main": {Model: "big", Dialect: "openai"}, "cheap": {Model: "small", Dialect: "ollama"}},
		Default: []string{"main"},
		Planner: planner(func(in PlanInput) Plan { seen = in; return answer })})
	resp, err := r.Complete(context.Background(), Request{Messages: userMsg("x"), Meta: RequestMeta{Session: "s", Purpose: "summary"}})
	if err != nil || resp.Route != "cheap" {
		t.Fatalf("%+v %v", resp, err)
	}
	if seen.Purpose != "summary" || seen.Session != "s" || len(seen.Routes) != 2 || seen.Routes[0].Name != "cheap" || seen.Routes[0].Model != "small" ||
		len(seen.Default) != 1 {
		t.Errorf("plan input %+v", seen)
	}
	for _, bad := range []Plan{{}, {Routes: []string{"gone"}}, {Routes: []string{"main", "main"}}} {
		answer = bad
		p := r.Plan(context.Background(), RequestMeta{})
		if !p.Fallback || len(p.Routes) != 1 || p.Routes[0] != "main" || !strings.HasPrefix(p.Reason, "default (model.plan") {
			t.Errorf("%+v: %+v", bad, p)
		}
	}
}

// TestRouterOneRoute: with one route there is nothing to plan; the planner
// is not asked.
func TestRouterOneRoute(t *testing.T) {
	a := modeltest.New()
	t.Cleanup(a.Close)
	a.Then(modeltest.Reply{Text: "a"})
	asked := 0
	r, _ := NewRouter(RouterOptions{Routes: map[string]Completer{"main": client(t, a.URL())}, Default: []string{"main"},
		Planner: planner(func(in PlanInput) Plan { asked++; return Plan{Routes: in.Default} })})
	if resp, err := r.Complete(context.Background(), Request{Messages: userMsg("x")}); err != nil || resp.Route != "main" || asked != 0 {
		t.Fatalf("%+v %v; planner asked %d times", resp, err, asked)
	}
}

func TestRouterCanceled(t *testing.T) {
	main := modeltest.New()
	t.Cleanup(main.Close)
	local := modeltest.New()
	t.Cleanup(local.Close)
	r, _ := NewRouter(RouterOptions{Routes: map[string]Completer{"main": client(t, main.URL()), "local": client(t, local.URL())},
		Default: []string{"main", "local"}})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := r.Complete(ctx, Request{Messages: userMsg("x")})
	if !errors.Is(err, context.Canceled) || local.Count() != 0 {
		t.Fatalf("%v; local asked %d", err, local.Count())
	}
}

// A session with a default plan of its own (a child's profile route) goes
// along it, and model.plan sees it as the default; other sessions keep
// the agent's; a session whose route is not configured fails, it does not
// fall back to the agent's.
func TestRouterSessionDefault(t *testing.T) {
	main, side := modeltest.New(), modeltest.New()
	t.Cleanup(main.Close)
	t.Cleanup(side.Close)
	main.Otherwise(func(int) modeltest.Reply { return modeltest.Reply{Text: "from main"} })
	side.Otherwise(func(int) modeltest.Reply { return modeltest.Reply{Text: "from side"} })
	var seen []PlanInput
	own := map[string][]string{"child-1": {"side", "main"}, "child-2": {"gone"}}
	lookup := func(s string) ([]string, error) {
		if s == "child-3" {
			return nil, errors.New("the store is down")
		}
		return own[s], nil
	}
	r, err := NewRouter(RouterOptions{
		Routes:  map[string]Completer{"main": client(t, main.URL()), "side": client(t, side.URL())},
		Default: []string{"main"}, SessionDefault: lookup,
		Planner: planner(func(in PlanInput) Plan { seen = append(seen, in); return Plan{Routes: in.Default, Reason: "hook"} })})
	if err != nil {
		t.Fatal(err)
	}
	send := func(session string) (*Response, error) {
		return r.Complete(context.Background(), Request{Messages: userMsg("x"), Meta: RequestMeta{Session: session}})
	}
	if resp, err := send("child-1"); err != nil || resp.Route != "side" || resp.Content != "from side" {
		t.Fatalf("child-1: %+v, %v", resp, err)
	}
	if resp, err := send("default"); err != nil || resp.Route != "main" {
		t.Fatalf("default: %+v, %v", resp, err)
	}
	if len(seen) != 2 || strings.Join(seen[0].Default, ",") != "side,main" || strings.Join(seen[1].Default, ",") != "main" {
		t.Fatalf("model.plan saw %+v", seen)
	}
	if _, err := send("child-2"); err == nil || !strings.Contains(err.Error(), `route "gone", which is not configured`) {
		t.Fatalf("child-2: %v, want refused", err)
	}
	if _, err := send("child-3"); err == nil || !strings.Contains(err.Error(), "the store is down") {
		t.Fatalf("child-3: %v, want failed", err)
	}
	if main.Count() != 1 || side.Count() != 1 {
		t.Fatalf("main %d, side %d requests; want 1 and 1", main.Count(), side.Count())
	}
	if p := r.Plan(context.Background(), RequestMeta{Session: "child-1", Purpose: "test"}); strings.Join(p.Routes, ",") != "main" {
		t.Fatalf("a route test of child-1 planned %v", p.Routes)
	}
	if err := r.Has("side", "main"); err != nil {
		t.Fatal(err)
	}
	if err := r.Has("gone"); err == nil || !strings.Contains(err.Error(), `"gone"`) {
		t.Fatalf("Has(gone): %v", err)
	}
}
