// Package placement contains each klbr-kernel's process tree: the core places a kernel by
// pid, before it sends the go-ahead, so that everything the kernel starts is inside the
// placement's limits and can be killed with it.
//
// Three modes, tried by [Detect] in this order:
//
//   - [ModeSystemdScope]: a transient klbr-<role>-<session>-<generation>.scope under
//     klbr.slice, created over D-Bus (go-systemd) with MemoryMax, TasksMax and
//     CPUQuotaPerSecUSec. systemd enforces the limits and stopping the scope kills the tree.
//   - [ModeCgroup]: a cgroup this process may write (a delegated subtree), created next to
//     the process's own cgroup, on cgroup v2 (memory.max, pids.max, cpu.max) or on cgroup v1
//     hierarchies (memory.limit_in_bytes, pids.max, cpu.cfs_quota_us). Release kills every
//     process in it and removes it.
//   - [ModeRlimit]: resource limits (RLIMIT_AS for memory, RLIMIT_NPROC for tasks) on the
//     kernel's child, inherited by its tree. They cannot be put on the kernel by pid: a Go
//     process dies under a small RLIMIT_AS. So the kernel takes them as flags
//     ([Placer.KernelArgs]) and sets them on its child before exec; Place checks that the
//     kernel was started with them. This is the weakest mode: RLIMIT_AS bounds address
//     space per process, not resident memory of the tree; RLIMIT_NPROC counts all
//     processes of the user, and is not enforced at all for root or with CAP_SYS_RESOURCE;
//     there is no CPU quota (RLIMIT_CPU is a lifetime budget that kills, not a rate).
//     Containment rests on the kernel's own process group and subreaper cleanup and its
//     parent-death signal.
//
// The mode in force and why each earlier mode was not available are reported
// ([Placer.Skipped], and the Options.Logger), never silent: doctor, status and /metrics
// show them.
//
// # The core's sequence
//
//	placer, err := placement.Detect(ctx, opts)      // once; report placer.Mode(), placer.Skipped()
//	args := append(placer.KernelArgs(spec), "--go-ahead-fd", "4", "--", python, "-m", "klbr_runtime")
//	// start klbr-kernel with args, the go-ahead pipe's read end as fd 4; close the read end
//	pl, err := placer.Place(ctx, kernelPid, spec)   // on error: close the write end without a byte (kernel exits 125)
//	// write one byte to the go-ahead pipe and close it
//	// … the kernel exits; 137 means its child was SIGKILLed: ask pl.OOMKilled() …
//	err = pl.Release(ctx)                           // always, also after the kernel exited
//
// TasksMax counts the kernel's own threads (a Go process: about 8) besides the tree.
package placement

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
)

// Mode names a way of placing a kernel.
type Mode string

// The modes, in the order Detect tries them.
const (
	ModeSystemdScope Mode = "systemd-scope"
	ModeCgroup       Mode = "cgroup"
	ModeRlimit       Mode = "rlimit"
)

// Limits bound a kernel's tree. Zero means unlimited.
type Limits struct {
	MemoryMaxBytes  int64 // memory of the whole tree
	TasksMax        int   // processes and threads of the whole tree
	CPUQuotaPercent int   // CPU time per wall-clock time, in percent of one CPU (200 = two CPUs)
}

// Spec says what is being placed.
type Spec struct {
	Role       string // "workbench", "hooks", "command", …
	Session    string
	Generation int64
	Limits     Limits
}

// Name is the placement's name without a suffix: klbr-<role>-<session>-<generation>, with
// role and session escaped the way systemd escapes unit names (anything but ASCII letters,
// digits, '_' and '.' becomes \xNN), so '-' only separates and the name is valid both as a
// unit name and as a cgroup directory.
func (s Spec) Name() string { return escapeName(s) }

func (s Spec) validate() error {
	switch {
	case s.Role == "" || s.Session == "":
		return errors.New("placement: spec needs a role and a session")
	case s.Generation < 0:
		return fmt.Errorf("placement: negative generation %d", s.Generation)
	case s.Limits.MemoryMaxBytes < 0 || s.Limits.TasksMax < 0 || s.Limits.CPUQuotaPercent < 0:
		return fmt.Errorf("placement: negative limit in %+v", s.Limits)
	}
	return nil
}

// Placer places kernels by pid.
type Placer interface {
	// Mode is the mode in force.
	Mode() Mode
	// Skipped lists the modes tried before this one and why each was not available.
	Skipped() []Skipped
	// KernelArgs returns the klbr-kernel flags this mode needs for spec, to be put before
	// "--" when the kernel is started: the rlimit mode's limits, which the kernel sets on
	// its child; nothing in the other modes.
	KernelArgs(spec Spec) []string
	// Place puts pid (a kernel waiting for its go-ahead) and so its future tree under the
	// spec's limits. It returns once the placement is in force.
	Place(ctx context.Context, pid int, spec Spec) (Placement, error)
	// Close releases what the placer holds (a bus connection); placements made stay.
	Close() error
}

// Placement is one placed tree.
type Placement interface {
	// Release kills whatever is left of the tree and removes the placement. It is safe to
	// call more than once and after the tree has exited.
	Release(ctx context.Context) error
	// OOMKilled reports whether the kernel's OOM killer killed a process of the tree because
	// of the memory limit. It returns ErrNotKnowable where the mode cannot tell.
	OOMKilled() (bool, error)
	// Describe says, for logs and status, what the placement is and what it enforces.
	Describe() string
}

// Skipped is a mode Detect did not use, with the reason.
type Skipped struct {
	Mode   Mode
	Reason error
}

func (s Skipped) String() string { return string(s.Mode) + ": " + s.Reason.Error() }

// ErrNotKnowable is returned by OOMKilled where the mode cannot tell.
var ErrNotKnowable = errors.New("placement: not knowable in this mode")

// Options configure Detect and the placers.
type Options struct {
	// SystemdBus is the D-Bus address of the bus that reaches systemd, e.g.
	// "unix:path=/run/dbus/system_bus_socket", or systemd's own "unix:path=/run/systemd/private".
	// Empty: the system bus ($DBUS_SYSTEM_BUS_ADDRESS or the standard socket).
	SystemdBus string
	// Slice holds the scopes; empty: "klbr.slice".
	Slice string
	// CgroupRoot is where the cgroup file systems are mounted; empty: "/sys/fs/cgroup".
	// It is only used to find the mounts in /proc/self/mountinfo that lie under it.
	CgroupRoot string
	// Only restricts Detect to these modes (in Detect's order); empty: all.
	Only []Mode
	// Logger receives one line per skipped mode and one for the mode chosen; nil: none.
	Logger *slog.Logger
	// Instance tells this placer's cgroups apart from another klbr-core's on the same
	// machine (cgroup mode: it suffixes each directory name). Without it, two daemons
	// whose sessions share a name and generation would take each other's cgroup for a
	// stale leftover and kill what runs in it. The daemon passes a digest of its data
	// directory, stable across restarts; empty means "p" + this process's pid.
	Instance string
}

func (o Options) instance() string {
	if o.Instance == "" {
		return "p" + strconv.Itoa(os.Getpid())
	}
	return o.Instance
}

func (o Options) slice() string {
	if o.Slice == "" {
		return "klbr.slice"
	}
	return o.Slice
}

func (o Options) cgroupRoot() string {
	if o.CgroupRoot == "" {
		return "/sys/fs/cgroup"
	}
	return o.CgroupRoot
}

func (o Options) allowed(m Mode) bool {
	if len(o.Only) == 0 {
		return true
	}
	for _, x := range o.Only {
		if x == m {
			return true
		}
	}
	return false
}

// Detect returns the first mode that works here, in the order systemd scope, cgroup,
// rlimit, and reports why each earlier one did not (Placer.Skipped, and the logger).
func Detect(ctx context.Context, opts Options) (Placer, error) {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("component", "placement")
	var skipped []Skipped
	skip := func(m Mode, err error) {
		skipped = append(skipped, Skipped{Mode: m, Reason: err})
		log.Warn("placement mode not available", "mode", string(m), "error", err)
	}
	try := []struct {
		mode Mode
		open func() (Placer, error)
	}{
		{ModeSystemdScope, func() (Placer, error) { return NewSystemd(ctx, opts) }},
		{ModeCgroup, func() (Placer, error) { return NewCgroup(opts) }},
		{ModeRlimit, func() (Placer, error) { return NewRlimit(), nil }},
	}
	for _, t := range try {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if !opts.allowed(t.mode) {
			skip(t.mode, errors.New("not among the allowed modes"))
			continue
		}
		pub, err := t.open()
		if err != nil {
			skip(t.mode, err)
			continue
		}
		p := pub.(placer)
		p.setSkipped(skipped)
		log.Info("placement mode", "mode", string(t.mode), "detail", p.describe())
		return p, nil
	}
	return nil, fmt.Errorf("placement: no mode available: %v", skipped)
}

// placer is what every mode implements, beyond Placer.
type placer interface {
	Placer
	setSkipped([]Skipped)
	describe() string
}

// skippedList is embedded by the placers.
type skippedList struct{ list []Skipped }

func (s *skippedList) Skipped() []Skipped     { return append([]Skipped(nil), s.list...) }
func (s *skippedList) setSkipped(l []Skipped) { s.list = append([]Skipped(nil), l...) }
