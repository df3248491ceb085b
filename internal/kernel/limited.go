package kernel

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"syscall"
	"unsafe"

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
	if spec.Nproc > 0 && spec.Sandbox.DropCaps && !spec.Sandbox.DropUser && os.Getuid() == 0 {
		// Without CAP_SYS_RESOURCE the limit would count every process of uid 0 on the
		// machine, not the tree's: the child could not fork at all. Root's tree was never
		// bounded by it (rlimit mode says so); it is not now.
		spec.Nproc = 0
	}
	// Under the limits this process may not map another page: RLIMIT_AS is usually
	// below what the Go runtime has reserved already, and a heap that must grow dies
	// with "runtime: out of memory". So everything the exec needs is allocated first,
	// no collection runs in between, and from the first limit to the exec only raw
	// system calls are made (unix.Exec would allocate its C strings after the limits).
	pathp, err := syscall.BytePtrFromString(path)
	if err != nil {
		return fail(ExitCannotRun, fmt.Errorf("exec %q: %w", path, err))
	}
	argvp, err := syscall.SlicePtrFromStrings(argv)
	if err != nil {
		return fail(ExitCannotRun, fmt.Errorf("exec %q: %w", path, err))
	}
	envp, err := syscall.SlicePtrFromStrings(os.Environ())
	if err != nil {
		return fail(ExitCannotRun, fmt.Errorf("exec %q: %w", path, err))
	}
	asLimit := unix.Rlimit{Cur: uint64(spec.AS), Max: uint64(spec.AS)}
	nprocLimit := unix.Rlimit{Cur: uint64(spec.Nproc), Max: uint64(spec.Nproc)}
	runtime.LockOSThread()
	debug.SetGCPercent(-1)
	if spec.AS > 0 {
		if _, _, e := unix.RawSyscall(unix.SYS_SETRLIMIT, unix.RLIMIT_AS, uintptr(unsafe.Pointer(&asLimit)), 0); e != 0 {
			return fail(ExitKernel, fmt.Errorf("setrlimit RLIMIT_AS %d: %w", spec.AS, e))
		}
	}
	if spec.Nproc > 0 {
		if _, _, e := unix.RawSyscall(unix.SYS_SETRLIMIT, unix.RLIMIT_NPROC, uintptr(unsafe.Pointer(&nprocLimit)), 0); e != 0 {
			return fail(ExitKernel, fmt.Errorf("setrlimit RLIMIT_NPROC %d: %w", spec.Nproc, e))
		}
	}
	_, _, e := unix.RawSyscall(unix.SYS_EXECVE, uintptr(unsafe.Pointer(pathp)),
		uintptr(unsafe.Pointer(&argvp[0])), uintptr(unsafe.Pointer(&envp[0])))
	if e == unix.ENOENT {
		return fail(ExitNotFound, fmt.Errorf("exec %q: %w", path, e))
	}
	return fail(ExitCannotRun, fmt.Errorf("exec %q: %w", path, e))
}
