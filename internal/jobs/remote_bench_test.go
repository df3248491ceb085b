package jobs

import (
	"context"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/config"
	"github.com/klbr-dev/klbr/internal/hosts"
	"github.com/klbr-dev/klbr/internal/hosttest"
	"github.com/klbr-dev/klbr/internal/store"
	"github.com/klbr-dev/klbr/internal/workertest"
)

// Dispatch latency of a no-op command (`true`), from jobs.run to its
// recorded end, here (klbr-kernel in a scope of its own) against on the
// second host (a unit of its systemd over the one SSH connection), side by
// side; then 100 small remote jobs, reporting the SSH connections sshd
// accepted for all of them. The host is polled every 10 ms, so the remote
// figure is the dispatch's own cost, not the poll interval (1 s by default).
//
//	go test -run '^$' -bench BenchmarkRemoteDispatch -benchtime 20x ./internal/jobs/
func BenchmarkRemoteDispatch(b *testing.B) {
	env := workertest.Setup(b)
	h := hosttest.Start(b)
	h.InstallKernel(b)
	tg, err := config.ParseSSHTarget(h.SSH())
	if err != nil {
		b.Fatal(err)
	}
	eng, err := hosts.New(hosts.Config{ConnectTimeout: 2 * time.Second, Hosts: map[string]hosts.Host{"lab": {
		Name: "lab", Target: tg, IdentityFile: h.IdentityFile, KnownHostsFile: h.KnownHostsFile,
		MaxJobs: 16, MemoryMaxBytes: 64 << 20, TasksMax: 64, CPUQuotaPct: 100, Wall: time.Hour, WorkDir: h.WorkDir}}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(eng.Close)
	st := benchStore(b)
	m := New(Config{Store: st, Kernel: env.Kernel, Python: env.Python, RuntimeSrc: env.Runtime, Workspace: b.TempDir(),
		Placer: env.Placer, Hosts: eng, HostPoll: 10 * time.Millisecond, MaxConcurrent: 16})
	if err := m.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(m.Close)
	ctx := context.Background()
	one := func(b *testing.B, host string) {
		j, err := m.Run(ctx, RunRequest{Session: "default", Spec: CommandSpec{Argv: []string{"true"}, Host: host}})
		if err != nil {
			b.Fatal(err)
		}
		if j, err = m.Wait(ctx, j.ID, 0, time.Minute); err != nil || j.State != store.JobSucceeded {
			b.Fatalf("job %s %q (%v)", j.State, j.Error, err)
		}
	}
	for _, c := range []struct{ name, host string }{{"local", ""}, {"remote", "lab"}} {
		b.Run(c.name, func(b *testing.B) {
			one(b, c.host) // warm: the SSH connection is made once
			b.ResetTimer()
			for b.Loop() {
				one(b, c.host)
			}
		})
	}
	// 100 jobs at once, whatever -benchtime says: the figures are the
	// connections sshd accepted for everything this benchmark ran, and the
	// wall time per job.
	b.Run("remote-100-jobs", func(b *testing.B) {
		start := time.Now()
		ids := make([]int64, 100)
		for i := range ids {
			j, err := m.Run(ctx, RunRequest{Session: "default", Spec: CommandSpec{Argv: []string{"true"}, Host: "lab"}})
			if err != nil {
				b.Fatal(err)
			}
			ids[i] = j.ID
		}
		for _, id := range ids {
			if j, err := m.Wait(ctx, id, 0, 2*time.Minute); err != nil || j.State != store.JobSucceeded {
				b.Fatalf("job %s %q (%v)", j.State, j.Error, err)
			}
		}
		b.ReportMetric(float64(time.Since(start).Milliseconds())/100, "ms/job")
		n, err := h.Accepted()
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(n), "ssh-connections")
		b.ReportMetric(float64(eng.Dials()), "ssh-dials")
	})
}
