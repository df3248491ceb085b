package placement

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// rlimitPlacer limits the kernel's child with resource limits; its tree inherits them.
type rlimitPlacer struct {
	skippedList
	privileged bool // root or CAP_SYS_RESOURCE: RLIMIT_NPROC is not enforced
}

// NewRlimit returns the last-resort placer, which always works.
//
// The limits are not set on the kernel by pid (a Go process cannot live under a small
// RLIMIT_AS: its runtime reserves about 1 GiB of address space, and a prlimit that lands
// while it starts, or before it next maps memory, kills it). The core passes them to the
// kernel as flags (KernelArgs); the kernel sets them on its child before exec; Place checks
// that the kernel was started with them.
//
// What it enforces, honestly:
//   - memory: RLIMIT_AS, the address space of each process (not of the tree, and not
//     resident memory: an allocation past it fails with ENOMEM / MemoryError; nothing is
//     OOM-killed; thread stacks count, 8 MiB each by default);
//   - tasks: RLIMIT_NPROC, checked at fork against the number of processes (threads) of the
//     whole real user, not of the tree; the kernel ignores it for root and for processes
//     with CAP_SYS_RESOURCE or CAP_SYS_ADMIN;
//   - CPU: nothing. RLIMIT_CPU is a budget of CPU seconds that ends in SIGKILL, not a quota.
//
// The kernel's process group, subreaper cleanup and parent-death signal stay the
// containment; Release has nothing to remove.
func NewRlimit() Placer {
	return &rlimitPlacer{privileged: hasSysResource()}
}

func (p *rlimitPlacer) Mode() Mode   { return ModeRlimit }
func (p *rlimitPlacer) Close() error { return nil }

func (p *rlimitPlacer) describe() string {
	tasks := "tasks by RLIMIT_NPROC (per user)"
	if p.privileged {
		tasks = "tasks NOT limited (RLIMIT_NPROC is not enforced for root/CAP_SYS_RESOURCE)"
	}
	return "rlimit: memory by RLIMIT_AS (address space per process), " + tasks + ", CPU not limited"
}

// KernelArgs are the flags that make the kernel set the limits on its child.
func (p *rlimitPlacer) KernelArgs(spec Spec) []string {
	var args []string
	if spec.Limits.MemoryMaxBytes > 0 {
		args = append(args, "--rlimit-as", strconv.FormatInt(spec.Limits.MemoryMaxBytes, 10))
	}
	if spec.Limits.TasksMax > 0 {
		args = append(args, "--rlimit-nproc", strconv.Itoa(spec.Limits.TasksMax))
	}
	return args
}

// Place checks that the kernel pid was started with KernelArgs(spec): the limits are its
// to set.
func (p *rlimitPlacer) Place(ctx context.Context, pid int, spec Spec) (Placement, error) {
	if err := spec.validate(); err != nil {
		return nil, err
	}
	b, err := readCmdline(ctx, pid)
	if err != nil {
		return nil, fmt.Errorf("rlimit: %w", err)
	}
	var flags []string
	for _, a := range strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00") {
		if a == "--" {
			break
		}
		flags = append(flags, a)
	}
	want := p.KernelArgs(spec)
	for i := 0; i+1 < len(want); i += 2 {
		if !hasFlag(flags, want[i], want[i+1]) {
			return nil, fmt.Errorf("rlimit: pid %d was not started with %s %s (placement.Placer.KernelArgs): its child would run unlimited", pid, want[i], want[i+1])
		}
	}
	return &rlimitPlacement{pid: pid, limits: spec.Limits, privileged: p.privileged}, nil
}

func hasFlag(args []string, name, value string) bool {
	for i, a := range args {
		if a == name+"="+value || (a == name && i+1 < len(args) && args[i+1] == value) {
			return true
		}
	}
	return false
}

type rlimitPlacement struct {
	pid        int
	limits     Limits
	privileged bool
}

// Release does nothing: the limits die with the processes, and the kernel kills its tree.
func (pl *rlimitPlacement) Release(context.Context) error { return nil }

// OOMKilled is not knowable: nothing is OOM-killed under RLIMIT_AS, allocations fail instead.
func (pl *rlimitPlacement) OOMKilled() (bool, error) {
	return false, fmt.Errorf("rlimit: allocations fail instead of OOM kills: %w", ErrNotKnowable)
}

func (pl *rlimitPlacement) Describe() string {
	var parts []string
	if pl.limits.MemoryMaxBytes > 0 {
		parts = append(parts, fmt.Sprintf("RLIMIT_AS=%d", pl.limits.MemoryMaxBytes))
	}
	switch {
	case pl.limits.TasksMax > 0 && pl.privileged:
		parts = append(parts, fmt.Sprintf("RLIMIT_NPROC=%d (not enforced: root/CAP_SYS_RESOURCE)", pl.limits.TasksMax))
	case pl.limits.TasksMax > 0:
		parts = append(parts, fmt.Sprintf("RLIMIT_NPROC=%d (counts every process of the user)", pl.limits.TasksMax))
	}
	if pl.limits.CPUQuotaPercent > 0 {
		parts = append(parts, "CPU quota not enforced")
	}
	if len(parts) == 0 {
		parts = append(parts, "no limits")
	}
	return fmt.Sprintf("rlimit on the child of kernel %d: %s", pl.pid, strings.Join(parts, ", "))
}

// hasSysResource reports whether this process is root or has CAP_SYS_RESOURCE (its
// children, the kernels, then have it too and RLIMIT_NPROC does not bind them).
func hasSysResource() bool {
	if os.Geteuid() == 0 {
		return true
	}
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			caps, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			if err == nil {
				return caps&(1<<unix.CAP_SYS_RESOURCE) != 0 || caps&(1<<unix.CAP_SYS_ADMIN) != 0
			}
		}
	}
	return false
}

// readCmdline reads pid's command line once its exec has finished. Right
// after exec.Cmd.Start returns, the kernel may not have set up the new
// program's argument pages yet (Start returns when close-on-exec ran, which
// comes before the ELF loader fills them), and /proc/pid/cmdline is empty.
// A klbr-kernel command line always holds "--", so wait for it, briefly.
func readCmdline(ctx context.Context, pid int) ([]byte, error) {
	path := "/proc/" + strconv.Itoa(pid) + "/cmdline"
	deadline := time.Now().Add(2 * time.Second)
	for {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		if strings.Contains(string(b), "\x00--\x00") || time.Now().After(deadline) {
			return b, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
}
