package agents

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/klbr-dev/klbr/internal/jobs"
	"github.com/klbr-dev/klbr/internal/store"
)

// job.plan may send a child to a host: it is told the host asked for, and
// its choice goes where a spawn's host= goes (here, a daemon without
// workspaces, which refuses any child on a host), checked as host= is; a
// shared workspace cannot go to a host, whoever chose it.
func TestJobPlanChoosesAChildsHost(t *testing.T) {
	a, _, started := newAgents(t, store.ChildLimits{MaxConcurrent: 4})
	var asked []PlanSpec
	var choice *string
	a.cfg.Plan = func(_ context.Context, _ string, in jobs.PlanInput) jobs.Plan {
		var s PlanSpec
		if err := json.Unmarshal(in.Spec, &s); err != nil {
			t.Fatal(err)
		}
		asked = append(asked, s)
		return jobs.Plan{Admit: true, Host: choice}
	}
	if _, err := call(t, a, "default", "agents.spawn", `{"task":"here"}`); err != nil || len(*started) != 1 {
		t.Fatalf("no choice: %v", err)
	}
	gpu := "gpu"
	choice = &gpu
	_, err := call(t, a, "default", "agents.spawn", `{"task":"on the box", "host": "label:big"}`)
	if asked[1].Host != "label:big" {
		t.Errorf("job.plan was told host %q, want the one asked for", asked[1].Host)
	}
	if code(err) != "unsupported" || !strings.Contains(err.Error(), "needs the workspaces") {
		t.Fatalf("the host job.plan chose did not reach the spawn's placement: %v", err)
	}
	_, err = call(t, a, "default", "agents.spawn", `{"task":"shared", "workspace": "shared"}`)
	if code(err) != "refused" || !strings.Contains(err.Error(), `job.plan chose host "gpu"`) || !strings.Contains(err.Error(), "works on a copy") {
		t.Fatalf("a shared workspace sent to a host: %v", err)
	}
	if len(*started) != 1 {
		t.Fatalf("children started %v, want only the first", *started)
	}
}
