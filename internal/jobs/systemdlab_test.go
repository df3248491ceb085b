package jobs

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/citest"
	"github.com/klbr-dev/klbr/internal/placement"
	"github.com/klbr-dev/klbr/internal/store"
	"github.com/klbr-dev/klbr/internal/systemdlab"
	"github.com/klbr-dev/klbr/internal/workertest"
)

// A job's command runs in a transient scope of its own with the configured
// limits, against a real systemd (package systemdlab): TestJobScope boots
// one and runs TestJobScopeInLab inside it.
const (
	labBusEnv    = "KLBR_JOBS_LAB_BUS"
	labKernelEnv = "KLBR_JOBS_LAB_KERNEL"
)

func TestJobScope(t *testing.T) {
	if os.Getenv(labBusEnv) != "" {
		t.Skip("inside the lab: TestJobScopeInLab runs here")
	}
	if os.Geteuid() != 0 {
		citest.SkipOrFail(t, "the test needs root")
	}
	systemdlab.Require(t)
	kernel := workertest.Setup(t).Kernel
	lab, err := systemdlab.Prepare(t, filepath.Join(t.TempDir(), "lab"), "klbr-jobs-lab")
	if err != nil {
		t.Fatal(err)
	}
	pid1, halt, err := lab.Boot(t)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(halt)
	cmd := exec.Command("nsenter", "-t", pid1, "-m", "-p", os.Args[0], "-test.run", "^TestJobScopeInLab$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), labBusEnv+"=unix:path=/run/dbus/system_bus_socket", labKernelEnv+"="+kernel)
	var inner bytes.Buffer
	cmd.Stdout, cmd.Stderr = &inner, &inner
	err = cmd.Run()
	t.Logf("inside the lab:\n%s", inner.String())
	if err != nil || !strings.Contains(inner.String(), "--- PASS: TestJobScopeInLab") {
		t.Fatalf("the test inside the lab did not pass: %v", err)
	}
}

func TestJobScopeInLab(t *testing.T) {
	bus := os.Getenv(labBusEnv)
	if bus == "" {
		t.Skip("runs inside the systemd lab that TestJobScope boots")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	p, err := placement.Detect(ctx, placement.Options{SystemdBus: bus})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if p.Mode() != placement.ModeSystemdScope {
		t.Fatalf("placement %s, want systemd-scope", p.Mode())
	}
	st, err := store.Open(ctx, t.TempDir(), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.Write(ctx, func(tx *store.Tx) error { _, err := tx.EnsureSession("default"); return err }); err != nil {
		t.Fatal(err)
	}
	m := New(Config{Store: st, Kernel: os.Getenv(labKernelEnv), Workspace: t.TempDir(), Placer: p,
		Limits: placement.Limits{TasksMax: 20, MemoryMaxBytes: 256 << 20}})
	if err := m.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	j, err := m.Run(ctx, RunRequest{Session: "default", Spec: CommandSpec{Argv: []string{"sh", "-c",
		`cat /proc/self/cgroup; systemctl show --property=TasksMax --property=MemoryMax klbr-command-default-1000001.scope`}}})
	if err != nil {
		t.Fatal(err)
	}
	j, err = m.Wait(ctx, j.ID, 0, 30*time.Second)
	if err != nil || j.State != store.JobSucceeded {
		t.Fatalf("job %s %q %v\n%s", j.State, j.Error, err, j.OutputPreview)
	}
	out := j.OutputPreview
	for _, want := range []string{"/klbr.slice/klbr-command-default-1000001.scope\n", "TasksMax=20\n", "MemoryMax=268435456\n"} {
		if !strings.Contains(out, want) {
			t.Fatalf("the command saw\n%s\nwant %q: its own scope with the job limits", out, want)
		}
	}
}
