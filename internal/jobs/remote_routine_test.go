package jobs

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/config"
	"github.com/klbr-dev/klbr/internal/hosts"
	"github.com/klbr-dev/klbr/internal/hosttest"
	"github.com/klbr-dev/klbr/internal/store"
)

// A routine scheduled with host= runs each of its runs in a worker on that
// host (a unit of its systemd, the release's tree sent there once), its
// requests answered here: its checkpoint is in klbr-core's store. A host
// that is down when a run is due leaves the job pending with the reason.
func TestScheduledRoutineOnAHost(t *testing.T) {
	r := newRig(t)
	h := hosttest.Start(t)
	h.InstallKernel(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	tg, err := config.ParseSSHTarget(h.SSH())
	if err != nil {
		t.Fatal(err)
	}
	eng, err := hosts.New(hosts.Config{ConnectTimeout: 2 * time.Second, Hosts: map[string]hosts.Host{"lab": {
		Name: "lab", Target: tg, IdentityFile: h.IdentityFile, KnownHostsFile: h.KnownHostsFile, Labels: []string{"big"},
		MaxJobs: 4, MemoryMaxBytes: 512 << 20, TasksMax: 64, CPUQuotaPct: 100, Wall: time.Hour, WorkDir: h.WorkDir}}})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	os.WriteFile(filepath.Join(r.tree, "klbr_skills", "where.py"), []byte(`import os
from klbr import jobs

async def run(input):
    await jobs.checkpoint({"seen": input["n"]})
    return {"netns": os.readlink("/proc/self/ns/net"), "n": input["n"]}
`), 0o644)
	m := New(Config{Store: r.st, Artifacts: r.arts, Kernel: r.env.Kernel, Python: r.env.Python, RuntimeSrc: r.env.Runtime,
		Workspace: r.workspace, Placer: r.env.Placer, Tree: func(string) string { return r.tree }, Hosts: eng, HostPoll: 50 * time.Millisecond})
	if err := m.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	netns, err := h.NetNS()
	if err != nil {
		t.Fatal(err)
	}

	if _, err := m.Schedule(ctx, ScheduleRequest{Session: "default", Release: release, Entry: "klbr_skills.where:run",
		Schedule: Schedule{Every: 1000}, Host: "nowhere"}); err == nil || !strings.Contains(err.Error(), "no such host") {
		t.Fatalf("host=nowhere: %v, want refused", err)
	}
	j, err := m.Schedule(ctx, ScheduleRequest{Session: "default", Release: release, Entry: "klbr_skills.where:run",
		Input: json.RawMessage(`{"n": 7}`), Schedule: Schedule{Every: 1000}, Host: "label:big"})
	if err != nil {
		t.Fatal(err)
	}
	for run := int64(1); run <= 2; run++ {
		j, err = m.Wait(ctx, j.ID, run-1, 60*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var res struct {
			NetNS string `json:"netns"`
			N     int    `json:"n"`
		}
		if err := json.Unmarshal(j.Result, &res); err != nil || res.NetNS != netns || res.N != 7 || j.Error != "" {
			t.Fatalf("run %d: %s %q result %s (%v); want it run on the host (%s)", run, j.State, j.Error, j.Result, err, netns)
		}
		if string(j.Checkpoint) != `{"seen":7}` || j.Host != "lab" {
			t.Fatalf("checkpoint %s, host %q", j.Checkpoint, j.Host)
		}
	}
	if !strings.Contains(describe(j), "on label:big") {
		t.Fatalf("describe: %q", describe(j))
	}

	h.SetLink(t, false)
	for {
		j, _ = r.st.Job(ctx, j.ID)
		if j.State == store.JobPending && strings.Contains(j.Error, "host unreachable") {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("with the host down: %s %q", j.State, j.Error)
		}
		time.Sleep(50 * time.Millisecond)
	}
	h.SetLink(t, true)
	if _, err := m.Cancel(ctx, j.ID); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if units, _ := h.Units("klbr-routine-*"); len(units) != 0 {
		t.Fatalf("units left on the host: %v", units)
	}
}
