package daemon

import (
	"context"
	"time"

	"github.com/klbr-dev/klbr/internal/api"
	"github.com/klbr-dev/klbr/internal/config"
	"github.com/klbr-dev/klbr/internal/jobs"
	"github.com/klbr-dev/klbr/internal/metrics"
	"github.com/klbr-dev/klbr/internal/placement"
)

// startJobs starts the durable jobs: it reconciles the jobs a previous run
// left running, arms the one timer, and binds jobs.* in every cell. Jobs run
// with the workbench's worker parts, in scopes of their own ([jobs] limits).
func (d *daemon) startJobs(ctx context.Context, cfg *config.Config, m *metrics.Metrics) error {
	m.WatchJobs(d.store, func() int64 {
		if d.jobs == nil {
			return 0
		}
		return d.jobs.Wakeups()
	})
	if d.bench == nil || d.releases == nil {
		return nil
	}
	wb := d.bench.Config()
	jc := cfg.File.Jobs.Resolved()
	l := jc.ScopeLimits()
	mem, _ := l.MemoryMaxBytes() // validated when the file was parsed
	cpu, _ := l.CPUQuotaPercent()
	jcfg := jobs.Config{
		Store: d.store, Artifacts: wb.Artifacts, Kernel: wb.Kernel, Python: wb.Python, RuntimeSrc: wb.RuntimeSrc,
		Workspace: wb.Workspace, Workspaces: wb.Workspaces, Placer: wb.Placer, Sandbox: wb.Sandbox, Tree: d.releases.Tree,
		Limits:        placement.Limits{MemoryMaxBytes: int64(mem), TasksMax: jc.TasksMax, CPUQuotaPercent: cpu},
		MaxConcurrent: jc.MaxConcurrent, MaxWall: time.Duration(jc.MaxWallSeconds) * time.Second, MaxOutput: jc.OutputBytes,
		Clock: d.clock, Log: d.log.With("component", "jobs"),
	}
	if d.hooks != nil {
		jcfg.Plan = d.hooks.PlanJob
	}
	jcfg.Hosts = d.hosts
	mgr := jobs.New(jcfg)
	if err := mgr.Start(ctx); err != nil {
		return err
	}
	d.jobs = mgr
	d.bench.SetOps("jobs.", jobs.NewOps(mgr))
	return nil
}

// jobsStatus is the jobs part of status.
func (d *daemon) jobsStatus() *api.JobsStatus {
	if d.jobs == nil {
		return nil
	}
	js := &api.JobsStatus{Running: d.jobs.Running()}
	if d.hosts != nil {
		js.Hosts = d.hosts.Statuses()
	}
	if t := d.jobs.NextWakeup(); !t.IsZero() {
		js.NextWakeup = &t
	}
	return js
}
