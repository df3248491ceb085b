package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/config"
	"github.com/klbr-dev/klbr/internal/hosts"
	"github.com/klbr-dev/klbr/internal/store"
)

// job.plan may choose the host a job runs on: a [hosts.NAME] or a label
// some host has, checked against klbr.toml as a cell's host= is. The job is
// stored asking for that host; a choice no host matches, or one for a
// command bound to a directory of this machine, refuses the job and says
// what to change. (Nothing is dispatched here: the manager is not started.)
func TestJobPlanChoosesTheHost(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	st, err := store.Open(ctx, dir, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.Write(ctx, func(tx *store.Tx) error { _, err := tx.EnsureSession("default"); return err }); err != nil {
		t.Fatal(err)
	}
	tg, err := config.ParseSSHTarget("klbr@127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	eng, err := hosts.New(hosts.Config{ConnectTimeout: time.Second, Hosts: map[string]hosts.Host{"gpu1": {Name: "gpu1", Target: tg,
		IdentityFile: "/nonexistent", KnownHostsFile: "/nonexistent", MaxJobs: 1, Wall: time.Hour, Labels: []string{"gpu"}}}})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	ws := filepath.Join(dir, "ws")
	var choice *string
	var asked []PlanInput
	m := New(Config{Store: st, Workspace: ws, Hosts: eng, Tree: func(string) string { return filepath.Join(dir, "tree") }, Plan: func(_ context.Context, _ string, in PlanInput) Plan {
		asked = append(asked, in)
		return Plan{Admit: true, Host: choice}
	}})
	defer m.Close()
	choose := func(h string) { choice = &h }
	specOf := func(j store.Job) map[string]any {
		var s map[string]any
		if err := json.Unmarshal(j.Spec, &s); err != nil {
			t.Fatal(err)
		}
		return s
	}

	// No choice: where the cell asked (here).
	j, err := m.Run(ctx, RunRequest{Session: "default", Spec: CommandSpec{Argv: []string{"true"}, Cwd: ws}})
	if err != nil || specOf(j)["host"] != nil || specOf(j)["cwd"] != ws {
		t.Fatalf("no choice: %s %v", j.Spec, err)
	}
	// A label: the command (in the workspace, the default) goes to a host
	// with it, in a directory of its own there.
	choose("label:gpu")
	j, err = m.Run(ctx, RunRequest{Session: "default", Spec: CommandSpec{Argv: []string{"make"}, Cwd: ws}})
	if err != nil || specOf(j)["host"] != "label:gpu" || specOf(j)["cwd"] != nil {
		t.Fatalf("job.plan chose label:gpu: %s %v", j.Spec, err)
	}
	// A name, over the cell's own host=.
	choose("gpu1")
	j, err = m.Run(ctx, RunRequest{Session: "default", Spec: CommandSpec{Argv: []string{"make"}, Host: "label:gpu"}})
	if err != nil || specOf(j)["host"] != "gpu1" {
		t.Fatalf("job.plan chose gpu1: %s %v", j.Spec, err)
	}
	if !strings.Contains(string(asked[len(asked)-1].Spec), `"host":"label:gpu"`) {
		t.Errorf("job.plan was not told the host asked for: %s", asked[len(asked)-1].Spec)
	}
	// A routine's runs too.
	j, err = m.Schedule(ctx, ScheduleRequest{Session: "default", Release: "r1", Entry: "klbr_skills.x:run", Schedule: Schedule{Every: 60000}})
	if err != nil || specOf(j)["host"] != "gpu1" {
		t.Fatalf("a routine: %s %v", j.Spec, err)
	}
	before, _ := st.Jobs(ctx, store.JobFilter{Session: "default", Limit: 100})

	for _, tc := range []struct {
		name, host string
		spec       CommandSpec
		want       string
	}{
		{"an unknown host", "nowhere", CommandSpec{Argv: []string{"true"}}, `job.plan chose host "nowhere": no such host`},
		{"an unknown label", "label:tpu", CommandSpec{Argv: []string{"true"}}, `no host has the label "tpu"`},
		{"a command bound here", "gpu1", CommandSpec{Argv: []string{"true"}, Cwd: filepath.Join(ws, "src")}, "a directory of this machine"},
	} {
		choose(tc.host)
		_, err := m.Run(ctx, RunRequest{Session: "default", Spec: tc.spec})
		if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want refused with %q", tc.name, err, tc.want)
		}
	}
	if after, _ := st.Jobs(ctx, store.JobFilter{Session: "default", Limit: 100}); len(after) != len(before) {
		t.Errorf("a refused job was stored: %d jobs, then %d", len(before), len(after))
	}
}
