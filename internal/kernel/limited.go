package kernel

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"

	"golang.org/x/sys/unix"
)

// execLimitedArg makes klbr-kernel act as a one-shot helper that sets resource limits on
// itself and execs the real child:
//
//	klbr-kernel __exec-limited AS NPROC PATH ARGV...
//
// Limits for the rlimit placement mode go to the child this way, not to the kernel: a Go
// process cannot live under a small RLIMIT_AS (the runtime reserves about 1 GiB of address
// space at start and dies with "cannot allocate memory" when it may not), and RLIMIT_NPROC
// would also bind the Go runtime's own thread creation. The helper is a fresh process
// without those limits; it sets them and execs at once, so the limits are in force from
// the child's first instruction.
const execLimitedArg = "__exec-limited"

// limitedCommand returns the command that starts argv (resolved to path) through the helper.
func limitedCommand(cfg Config, path string) *exec.Cmd {
	args := append([]string{execLimitedArg, strconv.FormatInt(cfg.RlimitAS, 10),
		strconv.FormatInt(cfg.RlimitNproc, 10), path}, cfg.Argv...)
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
	if len(args) < 4 {
		return fail(ExitKernel, errors.New("usage: __exec-limited AS NPROC PATH ARGV..."))
	}
	as, err1 := strconv.ParseUint(args[0], 10, 64)
	nproc, err2 := strconv.ParseUint(args[1], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return fail(ExitKernel, err)
	}
	path, argv := args[2], args[3:]
	if as > 0 {
		if err := unix.Setrlimit(unix.RLIMIT_AS, &unix.Rlimit{Cur: as, Max: as}); err != nil {
			return fail(ExitKernel, fmt.Errorf("setrlimit RLIMIT_AS %d: %w", as, err))
		}
	}
	if nproc > 0 {
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
