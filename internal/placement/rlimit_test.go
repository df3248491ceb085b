package placement

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestRlimitBoundsMemoryHog runs the core's flow in rlimit mode: klbr-kernel started with
// KernelArgs, placed, go-ahead; its child's 1 GiB allocation fails under RLIMIT_AS while
// the kernel and the test process are unaffected.
func TestRlimitBoundsMemoryHog(t *testing.T) {
	ctx := testCtx(t)
	kernel := klbrKernel(t)
	var before unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_AS, &before); err != nil {
		t.Fatal(err)
	}
	p := NewRlimit()
	spec := Spec{Role: "test", Session: "rlimit", Generation: 1,
		Limits: Limits{MemoryMaxBytes: 256 << 20, TasksMax: 64, CPUQuotaPercent: 50}}
	goR, goW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	args := append(p.KernelArgs(spec), "--go-ahead-fd", "3", "--", python(t), "-c", `
import resource
print(resource.getrlimit(resource.RLIMIT_AS)[1])
try:
    b = b"\x01" * (1 << 30)
    print("allocated")
except MemoryError:
    print("MemoryError")
`)
	cmd := exec.Command(kernel, args...)
	cmd.ExtraFiles = []*os.File{goR}
	dir := t.TempDir()
	out, _ := os.Create(filepath.Join(dir, "out"))
	defer out.Close()
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	goR.Close()
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	pl, err := p.Place(ctx, cmd.Process.Pid, spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(p.(*rlimitPlacer).describe())
	t.Log(pl.Describe())
	goW.Write([]byte{1})
	goW.Close()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("kernel did not exit")
	}
	b, _ := os.ReadFile(out.Name())
	if err != nil || strings.TrimSpace(string(b)) != "268435456\nMemoryError" {
		t.Fatalf("kernel: %v; output %q; want the child's hard RLIMIT_AS and a MemoryError", err, b)
	}
	if oom, err := pl.OOMKilled(); oom || !errors.Is(err, ErrNotKnowable) {
		t.Errorf("OOMKilled = %v, %v; want ErrNotKnowable", oom, err)
	}
	var after unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_AS, &after); err != nil {
		t.Fatal(err)
	}
	if after != before {
		t.Fatalf("the test process's own RLIMIT_AS changed: %+v → %+v", before, after)
	}
	if hasSysResource() && !strings.Contains(pl.Describe(), "not enforced") {
		t.Errorf("as root the description must say RLIMIT_NPROC is not enforced: %s", pl.Describe())
	}
	if !strings.Contains(pl.Describe(), "CPU quota not enforced") {
		t.Errorf("the description must say the CPU quota is not enforced: %s", pl.Describe())
	}
	if err := pl.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestRlimitRefusesAKernelWithoutItsFlags: placement fails closed when the core forgot
// KernelArgs, so the kernel gets no go-ahead.
func TestRlimitRefusesAKernelWithoutItsFlags(t *testing.T) {
	ctx := testCtx(t)
	h := startHeld(t, "true")
	spec := Spec{Role: "test", Session: "rlimit", Generation: 2, Limits: Limits{MemoryMaxBytes: 1 << 30}}
	if _, err := NewRlimit().Place(ctx, h.cmd.Process.Pid, spec); err == nil || !strings.Contains(err.Error(), "--rlimit-as 1073741824") {
		t.Fatalf("err = %v, want a refusal naming the missing flag", err)
	}
	// Without limits there is nothing to check.
	if _, err := NewRlimit().Place(ctx, h.cmd.Process.Pid, Spec{Role: "test", Session: "rlimit", Generation: 3}); err != nil {
		t.Fatal(err)
	}
	_ = h.cmd.Process.Signal(syscall.SIGKILL)
}

func TestHasFlag(t *testing.T) {
	args := []string{"/bin/klbr-kernel", "--rlimit-as", "100", "--rlimit-nproc=5"}
	if !hasFlag(args, "--rlimit-as", "100") || !hasFlag(args, "--rlimit-nproc", "5") || hasFlag(args, "--rlimit-as", "10") {
		t.Fatal("hasFlag")
	}
}
