package worker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"sort"
	"sync"
	"syscall"
	"time"

	"github.com/klbr-dev/klbr/internal/kernel"
	"github.com/klbr-dev/klbr/internal/placement"
)

// CommandSpec is a tracked command: workspace.run from a cell.
type CommandSpec struct {
	Kernel    string
	Placer    placement.Placer
	Limits    placement.Limits
	Sandbox   kernel.Sandbox // as Spec.Sandbox
	Session   string
	Seq       int64 // distinguishes this command's scope
	Argv      []string
	Dir       string            // already bound to the workspace
	Env       map[string]string // added to the kernel's allowlist
	Timeout   time.Duration
	MaxOutput int // bytes kept of stdout and of stderr, each
	// Output, when set, receives stdout and stderr both, as they come (a
	// durable job spools them to an artifact); it must not block and bounds
	// itself. Stdout and Stderr of the result are then empty.
	Output io.Writer
}

// CommandResult is how a tracked command ended.
type CommandResult struct {
	ExitCode  int    `json:"exit_code"`
	Stdout    []byte `json:"-"`
	Stderr    []byte `json:"-"`
	Truncated bool   `json:"truncated"` // some output was past MaxOutput
	TimedOut  bool   `json:"timed_out"`
	Cancelled bool   `json:"cancelled"` // ctx ended first; the tree was killed
}

// capped keeps the first max bytes written and counts the rest; it never
// blocks or fails, so the command never stalls on its output.
type capped struct {
	mu      sync.Mutex // guards buf, dropped
	max     int
	buf     []byte
	dropped int
}

func (c *capped) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	room := c.max - len(c.buf)
	if room > len(p) {
		room = len(p)
	}
	if room > 0 {
		c.buf = append(c.buf, p[:room]...)
	}
	c.dropped += len(p) - max(room, 0)
	return len(p), nil
}

// RunCommand runs argv under klbr-kernel in its own placement, with the
// timeout as the kernel's deadline, and kills the whole tree if ctx ends.
func RunCommand(ctx context.Context, s CommandSpec) (CommandResult, error) {
	if len(s.Argv) == 0 {
		return CommandResult{}, errors.New("run: empty argv")
	}
	if s.MaxOutput <= 0 {
		s.MaxOutput = 1 << 20
	}
	pspec := placement.Spec{Role: "command", Session: s.Session, Generation: s.Seq, Limits: s.Limits}
	var args []string
	if s.Placer != nil {
		args = append(args, s.Placer.KernelArgs(pspec)...)
	}
	args = append(args, s.Sandbox.Args()...)
	args = append(args, "--go-ahead-fd", "3")
	if s.Timeout > 0 {
		args = append(args, "--deadline", s.Timeout.String())
	}
	names := make([]string, 0, len(s.Env))
	for k := range s.Env {
		names = append(names, k)
	}
	sort.Strings(names)
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "LANG=C.UTF-8"}
	for _, k := range names {
		args = append(args, "--keep-env", k)
		env = append(env, k+"="+s.Env[k])
	}
	args = append(args, "--")
	args = append(args, s.Argv...)

	goRead, goWrite, err := os.Pipe()
	if err != nil {
		return CommandResult{}, fmt.Errorf("run: %w", err)
	}
	stdout, stderr := &capped{max: s.MaxOutput}, &capped{max: s.MaxOutput}
	cmd := exec.Command(s.Kernel, args...)
	cmd.Env, cmd.Dir = env, s.Dir
	cmd.Stdout, cmd.Stderr = stdout, stderr
	if s.Output != nil {
		cmd.Stdout, cmd.Stderr = s.Output, s.Output
	}
	cmd.ExtraFiles = []*os.File{goRead}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}

	started := make(chan error, 1)
	waited := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // Pdeathsig follows this thread; see Worker.start
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		waited <- cmd.Wait()
	}()
	err = <-started
	goRead.Close()
	if err != nil {
		goWrite.Close()
		return CommandResult{}, fmt.Errorf("run: start %s: %w", s.Kernel, err)
	}
	var pl placement.Placement
	if s.Placer != nil {
		if pl, err = s.Placer.Place(ctx, cmd.Process.Pid, pspec); err != nil {
			goWrite.Close() // no byte: the kernel starts nothing
			<-waited
			return CommandResult{}, fmt.Errorf("run: place: %w", err)
		}
		defer func() {
			rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			pl.Release(rctx)
		}()
	}
	goWrite.Write([]byte{1})
	goWrite.Close()

	var res CommandResult
	select {
	case err = <-waited:
	case <-ctx.Done():
		cmd.Process.Signal(syscall.SIGUSR1) // the kernel kills its whole tree now
		res.Cancelled = true
		select {
		case err = <-waited:
		case <-time.After(3 * time.Second):
			cmd.Process.Kill()
			err = <-waited
		}
	}
	res.Stdout, res.Stderr = stdout.buf, stderr.buf
	res.Truncated = stdout.dropped > 0 || stderr.dropped > 0
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		res.ExitCode = ee.ExitCode()
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			res.ExitCode = 128 + int(ws.Signal())
		}
	default:
		return res, fmt.Errorf("run: %w", err)
	}
	res.TimedOut = res.ExitCode == 124 && s.Timeout > 0 && !res.Cancelled
	return res, nil
}
