// Package kernel is the logic of klbr-kernel: the one place that turns "run this" into a
// contained process tree. cmd/klbr-kernel only calls [Main].
//
// # Contract
//
//	klbr-kernel [--protocol-fd N | --protocol-stdio | --listen SOCK [--grace D]] [--go-ahead-fd M] [--deadline DURATION] [--keep-env NAME]...
//	            [--rlimit-as BYTES] [--rlimit-nproc N]
//	            [--deny PATH]... [--ro PATH]... [--rw PATH]... [--tmp DIR]
//	            [--uid UID --gid GID] [--drop-caps] -- ARGV...
//	klbr-kernel --attach SOCK (relays stdin and stdout to a --listen kernel's socket)
//	klbr-kernel --version     (prints "klbr-kernel VERSION protocol N"; see [Protocol])
//
// What it does, in order:
//
//  1. At start the kernel sets PR_SET_CHILD_SUBREAPER (orphans of its tree are reparented
//     to it, not to init) and a parent-death signal, so that it dies with the process that
//     started it, and takes its tree along. That signal is SIGTERM, caught, not SIGKILL: a
//     SIGKILLed kernel could not kill its tree, and a double-forked daemon would outlive
//     it. A SIGTERM that finds the parent gone (getppid changed) kills the whole tree at
//     once, without grace, and the kernel exits. A parent that died before the prctl is
//     detected the same way and nothing is started.
//  2. With --go-ahead-fd M it blocks reading fd M until one byte arrives. EOF before a byte
//     (the core closed the pipe without writing) means "not placed": it exits 125 without
//     starting anything. The fd is closed afterwards. SIGTERM or SIGINT during the wait exit
//     128+signal, again without starting anything.
//  3. The child's environment is cleared to an allowlist ([FilterEnv]): PATH, HOME, LANG,
//     LC_ALL, LC_CTYPE, TZ, USER, LOGNAME, TMPDIR, every KLBR_*, PYTHONPATH,
//     PYTHONDONTWRITEBYTECODE, PYTHONUNBUFFERED, PYTHONSAFEPATH, PYTHONIOENCODING, plus each
//     --keep-env NAME.
//  4. The child gets stdin from /dev/null, the kernel's stdout and stderr, and, with
//     --protocol-fd N, the protocol socket as fd 3. Every other inherited fd is closed in the
//     kernel at start (and what the kernel keeps is close-on-exec), so nothing else reaches
//     the child. The kernel closes its own copy of the protocol socket once the child runs:
//     the core sees EOF on the socket as soon as the child (and anything it passed the socket
//     to) is gone. With --protocol-stdio instead (the core's end travels over an SSH
//     session to a worker host), the child reads the protocol from fd 3, the kernel's own
//     stdin, and writes it to fd 4 (KLBR_PROTOCOL_OUT_FD=4 in its environment), the
//     kernel's own stdout: nothing copies in between. The kernel points its stdin and stdout
//     at /dev/null once the child runs; the child's stdout goes to the kernel's stderr, and
//     the end of the kernel's stdin is the end of the protocol stream. With --listen SOCK (a
//     worker on a host, in a plain service unit) the kernel listens on SOCK (0600) and
//     carries the protocol as a resumable stream (internal/resume) over one connection at a
//     time, which klbr-core makes through its SSH connection: forwarded by the host's sshd to
//     /proc/PID/fd/N, the kernel's own O_PATH handle on SOCK (a link a cell puts at SOCK is
//     never what it names), or through a session running klbr-kernel --attach SOCK, the relay:
//     a dropped connection loses no byte and doubles none when the next one attaches; with
//     no connection for --grace (default 2m) the tree is killed as on SIGUSR1 (exit 137).
//  5. ARGV runs in its own process group, with PDEATHSIG=SIGKILL towards the kernel. SIGTERM
//     and SIGINT sent to the kernel are forwarded to that group. SIGINT is only forwarded
//     (Python turns it into KeyboardInterrupt); after a forwarded SIGTERM the child has a
//     2 s grace, then the whole tree is killed. SIGUSR1 is not forwarded: it kills the whole
//     tree at once (the core's "reset now", after its own interrupt grace); the kernel then
//     exits 137.
//  6. When the child exits, or at the --deadline (counted from the child's start: SIGTERM to
//     the group, 2 s grace, then SIGKILL), every descendant is killed: the child's group and
//     everything else whose ancestry leads to the kernel (double-forked daemons in other
//     groups and sessions are reparented to the kernel as subreaper). The kernel scans /proc,
//     SIGKILLs, reaps with wait4(-1) and repeats until it has no child left.
//  7. With --rlimit-as or --rlimit-nproc (placement's rlimit mode: placement.Placer.KernelArgs)
//     the child starts with RLIMIT_AS / RLIMIT_NPROC set as hard limits. They are set on the
//     child, never on the kernel: a Go process cannot even start under a small RLIMIT_AS (its
//     runtime reserves about 1 GiB of address space), and a prlimit on a running kernel kills
//     it the moment its runtime needs another mapping. The child is started through the
//     kernel binary itself in a one-shot helper mode that sets the limits and execs ARGV, so
//     they are in force from the child's first instruction; pid, process group, fds and
//     environment are the same.
//     With any of --deny, --ro, --rw, --tmp, --uid/--gid or --drop-caps ([Sandbox]) the
//     same helper, before it execs ARGV, sets no_new_privs, restricts itself with Landlock
//     (nothing beneath a --deny path but the --ro/--rw exceptions; read everywhere else;
//     write only beneath --rw paths, /dev and --tmp, which also becomes TMPDIR; no signals
//     or abstract sockets outside the sandbox), then drops the capabilities or the uid. The
//     kernel itself keeps all of it: it must still kill its tree. Where the running kernel
//     has no Landlock, the helper says so on stderr and goes on with the rest.
//  8. Exit status: the child's exit code; 128+N if the child was killed by signal N; 124 if
//     the deadline fired; 125 if the kernel itself failed (bad usage, not placed); 126 if
//     ARGV could not be executed; 127 if it was not found.
//  9. Diagnostics go to stderr prefixed "klbr-kernel:". The protocol stream is never read or
//     logged.
//
// # What the starting process (klbr-core) must do
//
// Parent death. PDEATHSIG fires when the parent *thread* exits, not the parent process
// (https://go.dev/issue/27505; the same holds for exec.Cmd SysProcAttr.Pdeathsig). The Go
// runtime keeps its threads for the life of the process, with one exception: a goroutine
// that exits while locked with runtime.LockOSThread takes its thread with it. If the core
// started the kernel from thread T and later some unrelated goroutine, scheduled on T, locked
// it and exited, the kernel would be SIGKILLed although the core is alive. So the core should:
//
//	go func() {
//		runtime.LockOSThread()         // T now runs only this goroutine
//		defer runtime.UnlockOSThread() // after Wait: T returns to the pool, never exits
//		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
//		err := cmd.Start()
//		...
//		err = cmd.Wait()
//	}()
//
// Setting SysProcAttr.Pdeathsig (SIGKILL is right there: nothing has started yet) as well
// as relying on the kernel's own prctl closes the race in which the core dies between fork
// and the kernel's prctl: the attribute is set in the forked child before exec and survives
// exec; the kernel then replaces it with its own SIGTERM. The kernel also locks its main goroutine to
// the main thread, which calls prctl and later starts the child, so that the child's
// PDEATHSIG is tied to a thread that lives as long as the kernel.
//
// Arguments. The flags that placement's mode needs (placement.Placer.KernelArgs: the
// rlimit mode's --rlimit-as and --rlimit-nproc) go before "--".
//
// Go-ahead. The core makes a pipe, passes its read end as an ExtraFiles entry (fd 3+i in
// the kernel) named by --go-ahead-fd, starts the kernel, closes its own copy of the read
// end, places the kernel by pid (placement.Placer.Place), then writes one byte to the write
// end and closes it. If placement fails it closes the write end without writing: the kernel
// exits 125 and nothing ran. The write end must be close-on-exec in the core (os.Pipe is).
//
// Stopping. The core stops a kernel with SIGTERM (forwarded, 2 s grace, tree killed, exit
// 128+15) and may SIGKILL it after a longer grace of its own; a SIGKILLed kernel cannot
// clean up, so the core then releases the placement (scope stop, cgroup kill), which is what
// contains a tree whose kernel is gone. In rlimit mode nothing does: descendants in other
// sessions survive a SIGKILLed kernel (the child itself dies by its PDEATHSIG).
package kernel
