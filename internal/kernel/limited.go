package kernel

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"

	"golang.org/x/sys/unix"
)

// execLimitedArg makes klbr-kernel act as a one-shot helper that limits and sandboxes itself
// and execs the real child:
//
//	klbr-kernel __exec-limited SPEC PATH ARGV...
//
// SPEC is a JSON [childSpec]. Limits for the rlimit placement mode go to the child this
// way, not to the kernel: a Go process cannot live under a small RLIMIT_AS (the runtime
// reserves about 1 GiB of address space at start and dies with "cannot allocate memory"
// when it may not), and RLIMIT_NPROC would also bind the Go runtime's own thread creation.
// The sandbox ([Sandbox]) is likewise the child's only: the kernel keeps the right to kill
// its tree and to read its own files. The helper is a fresh process; it sets the limits,
// restricts itself and execs at once, so all of it is in force from the child's first
// instruction.
const execLimitedArg = "__exec-limited"

// childSpec is what the helper applies before exec.
type childSpec struct {
	AS      int64   `json:"as,omitempty"`
	Nproc   int64   `json:"nproc,omitempty"`
	Sandbox Sandbox `json:"sandbox"`
}

// needsHelper reports whether the child must start through the helper.
func (c Config) needsHelper() bool {
	return c.RlimitAS > 0 || c.RlimitNproc > 0 || c.Sandbox.Active()
}

// limitedCommand returns the command that starts argv (resolved to path) through the helper.
func limitedCommand(cfg Config, path string) *exec.Cmd {
	spec, _ := json.Marshal(childSpec{AS: cfg.RlimitAS, Nproc: cfg.RlimitNproc, Sandbox: cfg.Sandbox})
	args := append([]string{execLimitedArg, string(spec), path}, cfg.Argv...)
	cmd := exec.Command("/proc/self/exe", args...)
	cmd.Args[0] = "klbr-kernel"
	return cmd
}

// execLimited is the helper's whole life; it returns only on failure, with the exit status.
func execLimited(args []string) int {
	fail := func(code int, err error) int {
		fmt.Fprintf(os.Stderr, "klbr-kernel: %v\n", err)
		return code
	}
	if len(args) < 3 {
		return fail(ExitKernel, errors.New("usage: __exec-limited SPEC PATH ARGV..."))
	}
	var spec childSpec
	if err := json.Unmarshal([]byte(args[0]), &spec); err != nil {
		return fail(ExitKernel, fmt.Errorf("__exec-limited: spec: %w", err))
	}
	path, argv := args[1], args[2:]
	// The sandbox first: it allocates (the Landlock rules) and a Go process cannot live
	// under a small RLIMIT_AS.
	note, serr := applySandbox(spec.Sandbox)
	if serr != nil {
		return fail(ExitKernel, serr)
	}
	if note != "" {
		fmt.Fprintf(os.Stderr, "klbr-kernel: %s\n", note)
	}
	if as := uint64(spec.AS); as > 0 {
		if err := unix.Setrlimit(unix.RLIMIT_AS, &unix.Rlimit{Cur: as, Max: as}); err != nil {
			return fail(ExitKernel, fmt.Errorf("setrlimit RLIMIT_AS %d: %w", as, err))
		}
	}
	if spec.Nproc > 0 && spec.Sandbox.DropCaps && !spec.Sandbox.DropUser && os.Getuid() == 0 {
		// Without CAP_SYS_RESOURCE the limit would count every process of uid 0 on the
		// machine, not the tree's: the child could not fork at all. Root's tree was never
		// bounded by it (rlimit mode says so); it is not now.
		spec.Nproc = 0
	}
	if nproc := uint64(spec.Nproc); nproc > 0 {
		if err := unix.Setrlimit(unix.RLIMIT_NPROC, &unix.Rlimit{Cur: nproc, Max: nproc}); err != nil {
			return fail(ExitKernel, fmt.Errorf("setrlimit RLIMIT_NPROC %d: %w", nproc, err))
		}
	}
	err := unix.Exec(path, argv, os.Environ())
	if errors.Is(err, unix.ENOENT) {
		return fail(ExitNotFound, fmt.Errorf("exec %q: %w", path, err))
	}
	return fail(ExitCannotRun, fmt.Errorf("exec %q: %w", path, err))
}
