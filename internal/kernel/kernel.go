package kernel

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

const (
	// termGrace is how long the child has between SIGTERM (forwarded, or at the deadline)
	// and SIGKILL of the whole tree.
	termGrace = 2 * time.Second
	// cleanupLimit bounds the kill-and-reap loop; a tree that survives it is reported.
	cleanupLimit = 10 * time.Second
)

// Main runs klbr-kernel with args (the command line without the program name) and returns
// the process exit status; see the package doc for the contract. It must be called from
// the main goroutine, and it locks that goroutine to its thread for good (cmd/klbr-kernel
// locks it to the main thread in init): that thread calls prctl and starts the child, so
// both parent-death signals are tied to a thread that lives as long as the kernel.
func Main(args []string) int {
	runtime.LockOSThread()
	if len(args) > 0 && args[0] == execLimitedArg {
		return execLimited(args[1:])
	}
	if len(args) == 2 && args[0] == attachArg {
		return attach(args[1])
	}
	if len(args) == 1 && args[0] == versionArg {
		return printVersion(os.Stdout)
	}
	k := &kernel{log: log.New(os.Stderr, "klbr-kernel: ", 0), self: os.Getpid(), ppid: os.Getppid()}
	return k.run(args)
}

type kernel struct {
	log    *log.Logger
	self   int
	ppid   int       // the parent at start; a different getppid() means it died
	killed bool      // the kernel has SIGKILLed the tree (grace over, parent gone)
	listen *listener // --listen
	// signalled: the kernel was told to end the tree (SIGTERM, SIGUSR1):
	// --listen does not wait for a peer to take the child's last frames.
	signalled bool
}

// parentGone reports whether the process that started the kernel has died (the kernel was
// reparented to a subreaper or init).
func (k *kernel) parentGone() bool { return os.Getppid() != k.ppid }

func (k *kernel) run(args []string) int {
	cfg, err := ParseArgs(args)
	if err != nil {
		k.log.Print(err)
		return ExitKernel
	}
	// The parent-death signal is SIGTERM, which the kernel catches: SIGKILL would kill the
	// kernel alone and strand its tree (its child dies by its own PDEATHSIG, but the rest
	// would be reparented away). On SIGTERM with the parent gone, the kernel kills the tree
	// at once, without grace, and exits. A parent that died before this prctl is caught by
	// the getppid check below (and by the core's own SysProcAttr.Pdeathsig, set before exec).
	if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(unix.SIGTERM), 0, 0, 0); err != nil {
		k.log.Printf("prctl PR_SET_PDEATHSIG: %v", err)
		return ExitKernel
	}
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		k.log.Printf("prctl PR_SET_CHILD_SUBREAPER: %v", err)
		return ExitKernel
	}

	var keep []int
	for _, fd := range []int{cfg.ProtocolFD, cfg.GoAheadFD} {
		if fd < 0 {
			continue
		}
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil {
			k.log.Printf("fd %d named on the command line is not open: %v", fd, err)
			return ExitKernel
		}
		keep = append(keep, fd)
	}
	if _, err := sanitizeFDs(keep...); err != nil {
		k.log.Print(err)
		return ExitKernel
	}

	// Signals are caught before the child exists so none is lost. SIGPIPE is caught too:
	// a kernel whose stderr reader went away must still clean up, not die of it (a caught
	// signal, unlike an ignored one, is reset to default in the child).
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, unix.SIGTERM, unix.SIGINT, unix.SIGUSR1)
	chld := make(chan os.Signal, 1)
	signal.Notify(chld, unix.SIGCHLD)
	pipe := make(chan os.Signal, 1)
	signal.Notify(pipe, unix.SIGPIPE)
	defer signal.Stop(sigs)
	defer signal.Stop(chld)
	defer signal.Stop(pipe)

	if k.parentGone() {
		k.log.Print("parent died before the kernel started: starting nothing")
		return ExitKernel
	}
	if cfg.GoAheadFD >= 0 {
		if code, ok := k.waitGoAhead(cfg.GoAheadFD, sigs); !ok {
			return code
		}
	}

	cmd, code, ok := k.start(cfg)
	if !ok {
		return code
	}
	pid := cmd.Process.Pid
	status, deadlineFired := k.supervise(cfg, pid, chld, sigs)
	if status.Signaled() && status.Signal() == unix.SIGKILL && !k.killed {
		// Not the kernel's doing: most likely the OOM killer of the placement's cgroup.
		// Say so while the cgroup still exists (a systemd scope goes with the kernel).
		if n, ok := memoryCgroupOOMKills(); ok && n > 0 {
			k.log.Printf("child killed by SIGKILL; the memory cgroup has recorded %d OOM kill(s)", n)
		} else {
			k.log.Print("child killed by SIGKILL from outside the kernel")
		}
	}
	if n := k.cleanup(pid); n > 0 {
		k.log.Printf("killed %d leftover process(es) of the tree", n)
	}
	_ = cmd.Process.Release()
	k.drainListen()

	switch {
	case deadlineFired:
		return ExitDeadline
	case status.Exited():
		return status.ExitStatus()
	case status.Signaled():
		return 128 + int(status.Signal())
	}
	k.log.Printf("child ended with unexpected wait status %#x", uint32(status))
	return ExitKernel
}

// waitGoAhead blocks until one byte arrives on fd. ok is false when the kernel must exit
// with code instead of starting the child.
func (k *kernel) waitGoAhead(fd int, sigs <-chan os.Signal) (code int, ok bool) {
	f := os.NewFile(uintptr(fd), "go-ahead")
	got := make(chan error, 1)
	go func() {
		var b [1]byte
		n, err := f.Read(b[:])
		if n == 1 {
			err = nil
		} else if err == nil {
			err = io.ErrUnexpectedEOF
		}
		got <- err
	}()
	select {
	case err := <-got:
		f.Close()
		switch {
		case err == nil:
			return 0, true
		case errors.Is(err, io.EOF):
			k.log.Print("go-ahead closed without a byte: not placed, starting nothing")
		default:
			k.log.Printf("go-ahead: %v: starting nothing", err)
		}
		return ExitNotPlaced, false
	case s := <-sigs:
		// The reader goroutine stays blocked; the process exits right after.
		sig := s.(syscall.Signal)
		if sig == unix.SIGUSR1 {
			sig = unix.SIGKILL // the tree, had it started, would have died so
		}
		if sig == unix.SIGTERM && k.parentGone() {
			k.log.Print("parent died before the go-ahead: starting nothing")
		} else {
			k.log.Printf("%v before the go-ahead: starting nothing", sig)
		}
		return 128 + int(sig), false
	}
}

// start starts the child in its own process group.
func (k *kernel) start(cfg Config) (cmd *exec.Cmd, code int, ok bool) {
	cmd = exec.Command(cfg.Argv[0], cfg.Argv[1:]...)
	if cmd.Err == nil && cfg.needsHelper() {
		cmd = limitedCommand(cfg, cmd.Path)
	}
	cmd.Env = FilterEnv(os.Environ(), cfg.KeepEnv)
	if cfg.Sandbox.TempDir != "" {
		cmd.Env = append(slices.DeleteFunc(cmd.Env, func(kv string) bool { return strings.HasPrefix(kv, "TMPDIR=") }),
			"TMPDIR="+cfg.Sandbox.TempDir)
	}
	cmd.Stdin = nil // the null device
	cmd.Stdout = os.Stdout
	cmd.Stderr = os.Stderr
	var proto *os.File
	if cfg.ProtocolFD >= 0 {
		proto = os.NewFile(uintptr(cfg.ProtocolFD), "protocol")
		cmd.ExtraFiles = []*os.File{proto} // fd 3 in the child
	}
	if cfg.ProtocolStdio {
		cmd.ExtraFiles = stdioProtocol()
		cmd.Env = append(slices.DeleteFunc(cmd.Env, func(kv string) bool { return strings.HasPrefix(kv, "KLBR_PROTOCOL_OUT_FD=") }),
			"KLBR_PROTOCOL_OUT_FD="+strconv.Itoa(stdioOutFD))
		cmd.Stdout = os.Stderr // stdout is the protocol's now
	}
	if cfg.Listen != "" {
		var err error
		if proto, err = k.bridgeListen(cfg.Listen, cfg.Grace); err != nil {
			k.log.Print(err)
			return nil, ExitKernel, false
		}
		cmd.ExtraFiles = []*os.File{proto}
		cmd.Stdout = os.Stderr
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	err := cmd.Start()
	if proto != nil {
		// The child has its own copy; ours would keep the socket open after the child died.
		proto.Close()
	}
	if cfg.ProtocolStdio && err == nil {
		if rerr := releaseStdio(); rerr != nil {
			k.log.Print(rerr)
		}
	}
	if err != nil {
		k.log.Printf("start %q: %v", cfg.Argv[0], err)
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
			return nil, ExitNotFound, false
		}
		return nil, ExitCannotRun, false
	}
	return cmd, 0, true
}

// supervise waits for the child (pid, also its process group), forwarding signals and
// enforcing the deadline. Other children (reparented orphans) are reaped as they exit.
func (k *kernel) supervise(cfg Config, pid int, chld, sigs <-chan os.Signal) (status unix.WaitStatus, deadlineFired bool) {
	var deadline, grace <-chan time.Time
	if cfg.Deadline > 0 {
		t := time.NewTimer(cfg.Deadline)
		defer t.Stop()
		deadline = t.C
	}
	startGrace := func() {
		if grace == nil {
			grace = time.After(termGrace)
		}
	}
	for {
		if st, done := reapChildren(pid); done {
			return st, deadlineFired
		}
		select {
		case <-chld:
		case s := <-sigs:
			sig := s.(syscall.Signal)
			k.signalled = k.signalled || sig == unix.SIGTERM || sig == unix.SIGUSR1
			if sig == unix.SIGTERM && k.parentGone() {
				k.log.Print("parent died: killing the tree")
				k.killTree(pid)
				continue
			}
			if sig == unix.SIGUSR1 {
				k.log.Print("SIGUSR1: killing the tree")
				k.killTree(pid)
				continue
			}
			if err := unix.Kill(-pid, sig); err != nil && err != unix.ESRCH {
				k.log.Printf("forward %v: %v", sig, err)
			}
			if sig == unix.SIGTERM {
				startGrace()
			}
		case <-deadline:
			deadline, deadlineFired = nil, true
			k.log.Printf("deadline %s reached: SIGTERM to the child's process group", cfg.Deadline)
			_ = unix.Kill(-pid, unix.SIGTERM)
			startGrace()
		case <-grace:
			grace = make(chan time.Time) // never again
			k.log.Printf("child still running %s after SIGTERM: killing the tree", termGrace)
			k.killTree(pid)
		}
	}
}

// reapChildren reaps every child that has exited, without blocking. done is true when one of
// them was pid; status is then its wait status.
func reapChildren(pid int) (status unix.WaitStatus, done bool) {
	for {
		var ws unix.WaitStatus
		r, err := unix.Wait4(-1, &ws, unix.WNOHANG|unix.WALL, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil || r <= 0 {
			return status, done
		}
		if r == pid {
			status, done = ws, true
		}
	}
}

// killTree SIGKILLs the process group pgid and every live descendant of the kernel. It
// returns how many descendants it signalled.
func (k *kernel) killTree(pgid int) int {
	k.killed = true
	_ = unix.Kill(-pgid, unix.SIGKILL)
	procs, err := readProcs("/proc")
	if err != nil {
		k.log.Printf("scan /proc: %v", err)
		return 0
	}
	n := 0
	for _, p := range descendants(procs, k.self) {
		if p.state == 'Z' || p.state == 'X' {
			continue
		}
		if unix.Kill(p.pid, unix.SIGKILL) == nil {
			n++
		}
	}
	return n
}

// cleanup kills and reaps until the kernel has no child at all: every descendant's chain of
// parents passes through a child of the kernel, so no child means no descendant. It returns
// how many processes it had to signal beyond the first pass's group kill.
func (k *kernel) cleanup(pgid int) int {
	total := 0
	start := time.Now()
	pause := time.Millisecond
	for {
		total += k.killTree(pgid)
		reapChildren(-1)
		var ws unix.WaitStatus
		_, err := unix.Wait4(-1, &ws, unix.WNOHANG|unix.WALL, nil)
		if err == unix.ECHILD {
			return total
		}
		if time.Since(start) > cleanupLimit {
			k.log.Print(fmt.Sprintf("processes of the tree survived %s of SIGKILL; giving up", cleanupLimit))
			return total
		}
		time.Sleep(pause)
		pause = min(2*pause, 50*time.Millisecond)
	}
}
