package agents

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/klbr-dev/klbr/internal/jobs"
	"github.com/klbr-dev/klbr/internal/profiles"
	"github.com/klbr-dev/klbr/internal/store"
	"github.com/klbr-dev/klbr/internal/workbench"
	"github.com/klbr-dev/klbr/internal/worker"
	"github.com/klbr-dev/klbr/internal/workspace"
)

var testRelease = strings.Repeat("a", 64)

// newProfiled returns agents whose root "default" is on a release holding
// files (profiles/…), with routes "main" and "cheap" configured.
func newProfiled(t testing.TB, files map[string]string) (*Agents, *store.Store) {
	t.Helper()
	st, err := store.Open(context.Background(), t.TempDir(), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if err := st.Write(context.Background(), func(tx *store.Tx) error {
		if _, err := tx.EnsureSession("default"); err != nil {
			return err
		}
		if err := tx.RecordRelease(testRelease, json.RawMessage(`{}`)); err != nil {
			return err
		}
		_, err := tx.Activate("default", 0, testRelease, "initial", "test")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	tree := t.TempDir()
	for p, body := range files {
		os.MkdirAll(filepath.Join(tree, filepath.Dir(p)), 0o755)
		if err := os.WriteFile(filepath.Join(tree, p), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	m := jobs.New(jobs.Config{Store: st})
	t.Cleanup(m.Close)
	return New(Config{Store: st, Jobs: m,
		Tree: func(id string) string { return map[string]string{testRelease: tree}[id] },
		Routes: func(names ...string) error {
			for _, n := range names {
				if n != "main" && n != "cheap" {
					return fmt.Errorf("route %q is not configured", n)
				}
			}
			return nil
		}}), st
}

var reviewFiles = map[string]string{
	"profiles/review.toml": "description = \"reviews\"\ninstructions = \"Report problems, not style.\"\nroute = \"cheap\"\nfallback = [\"main\"]\n" +
		"delegate = [\"discord.react\"]\n[budget]\ntokens = 1000\nwall_seconds = 60\n",
	"profiles/plain.toml":   "description = \"plain\"\n",
	"profiles/faraway.toml": "description = \"far\"\nroute = \"faraway\"\n",
}

// A spawn with a profile records it and its route in the child's spec,
// narrows the budget key by key, joins the delegated ops, and puts the
// instructions in the task input.
func TestSpawnWithProfile(t *testing.T) {
	a, st := newProfiled(t, reviewFiles)
	ctx := context.Background()
	j, err := call(t, a, "default", "agents.spawn", `{"task":"review the diff","profile":"review","delegate":["local.send"],"budget":{"tokens":500,"model_requests":3}}`)
	if err != nil {
		t.Fatal(err)
	}
	spec, _ := store.ChildSpecOf(j)
	if spec.Profile != "review" || spec.Route != "cheap" || !slices.Equal(spec.Fallback, []string{"main"}) ||
		!slices.Equal(spec.Delegate, []string{"discord.react", "local.send"}) {
		t.Fatalf("spec %+v", spec)
	}
	var budget map[string]float64
	if json.Unmarshal(j.Budget, &budget) != nil || budget["tokens"] != 500 || budget["wall_seconds"] != 60 || budget["model_requests"] != 3 || len(budget) != 3 {
		t.Fatalf("budget %s, want tokens 500 (the spawn's), wall_seconds 60 (the profile's), model_requests 3", j.Budget)
	}
	recs, err := st.Records(ctx, spec.Session, 0, 10)
	var body struct{ Text string }
	for _, r := range recs {
		if r.Lane == store.LaneInput {
			json.Unmarshal(r.Content, &body)
		}
	}
	if err != nil || !strings.Contains(body.Text, "review the diff") ||
		!strings.Contains(body.Text, "profile review. Its instructions:\nReport problems, not style.") {
		t.Fatalf("the child's task input %+v, %v", recs, err)
	}
	if s, _ := st.Session(ctx, spec.Session); s.PolicyRevision != testRelease {
		t.Fatalf("the child is on %q", s.PolicyRevision)
	}
	// A profile without route or budget: the agent's plan, the spawn's budget.
	j, err = call(t, a, "default", "agents.spawn", `{"task":"x","profile":"plain","budget":{"tokens":7}}`)
	spec, _ = store.ChildSpecOf(j)
	if err != nil || spec.Profile != "plain" || spec.Route != "" || string(j.Budget) != `{"tokens":7}` {
		t.Fatalf("plain: %+v %s, %v", spec, j.Budget, err)
	}
}

// Unknown profiles and unconfigured routes are refused, naming what is
// there; a bad spawn budget is refused against the profile's; nothing of
// a refused spawn is stored.
func TestSpawnProfileRefusals(t *testing.T) {
	a, st := newProfiled(t, reviewFiles)
	for _, tc := range []struct{ args, code, want string }{
		{`{"task":"x","profile":"researcher"}`, "refused", `no such profile "researcher" in the release (it has faraway, plain, review)`},
		{`{"task":"x","profile":"faraway"}`, "refused", `profile "faraway" names route [faraway]: route "faraway" is not configured`},
		{`{"task":"x","profile":"review","budget":{"cost":1}}`, "invalid", `"cost" is not a budget key`},
		{`{"task":"x","profile":"review","budget":{"tokens":-1}}`, "invalid", "budget.tokens: must be an integer > 0"},
		{`{"task":"x","profile":"../review"}`, "invalid", "not a profile name"},
	} {
		if _, err := call(t, a, "default", "agents.spawn", tc.args); code(err) != tc.code || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("spawn %s: %v, want %s %q", tc.args, err, tc.code, tc.want)
		}
	}
	if js, _ := st.Jobs(context.Background(), store.JobFilter{Session: "default"}); len(js) != 0 {
		t.Fatalf("refused spawns stored %d jobs", len(js))
	}
	// A session without profiles/ names none.
	b, _ := newProfiled(t, nil)
	if _, err := call(t, b, "default", "agents.spawn", `{"task":"x","profile":"review"}`); code(err) != "refused" || !strings.Contains(err.Error(), "it has none") {
		t.Fatalf("spawn without profiles: %v", err)
	}
}

// agents.profiles lists the profiles of the caller's release.
func TestListProfiles(t *testing.T) {
	a, _ := newProfiled(t, reviewFiles)
	out, err := a.HandleRequest(workbench.WithSession(context.Background(), "default"), worker.Request{Op: "agents.profiles", Args: json.RawMessage(`{}`)})
	var r struct {
		Release  string
		Profiles []profiles.Profile
	}
	if err != nil || json.Unmarshal(out, &r) != nil || r.Release != testRelease || len(r.Profiles) != 3 || r.Profiles[2].Name != "review" || r.Profiles[2].Route != "cheap" {
		t.Fatalf("%s, %v", out, err)
	}
}

func TestDelegableIsTheProfilesList(t *testing.T) {
	if !slices.Equal(Delegable, profiles.Delegable) || errors.Is(nil, profiles.ErrInvalid) {
		t.Fatal(Delegable)
	}
}

// A profile's host places its children on that host unless the spawn
// names one: here no host is configured, so the spawn is refused saying
// so (and a shared workspace with it is refused as the spawn's own host=
// would be); nothing is stored.
func TestProfileHost(t *testing.T) {
	a, st := newProfiled(t, map[string]string{"profiles/trainer.toml": "description = \"trains\"\nhost = \"label:gpu\"\n"})
	a.cfg.Workspaces = &workspace.Workspaces{Root: t.TempDir(), Dir: filepath.Join(t.TempDir(), "worktrees")}
	for _, tc := range []struct{ args, code, want string }{
		{`{"task":"x","profile":"trainer"}`, "refused", `host="label:gpu", but klbr.toml defines no [hosts.NAME]`},
		{`{"task":"x","profile":"trainer","host":"cpu"}`, "refused", `host="cpu", but klbr.toml defines no [hosts.NAME]`},
		{`{"task":"x","profile":"trainer","workspace":"shared"}`, "invalid", "a child on a host works on a copy"},
	} {
		if _, err := call(t, a, "default", "agents.spawn", tc.args); code(err) != tc.code || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("spawn %s: %v, want %s %q", tc.args, err, tc.code, tc.want)
		}
	}
	if js, _ := st.Jobs(context.Background(), store.JobFilter{Session: "default"}); len(js) != 0 {
		t.Fatalf("refused spawns stored %d jobs", len(js))
	}
}
