package worker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"syscall"
	"time"

	"github.com/klbr-dev/klbr/internal/kernel"
	"github.com/klbr-dev/klbr/internal/resume"
)

// Resumable is a Remote whose worker outlives its connection: the unit runs
// klbr-kernel --listen as a plain service of the host's systemd, and each
// connection to it is a session of the host's SSH connection running
// klbr-kernel --attach. The protocol travels as a resumable stream
// (internal/resume): a dropped connection is made again and the worker
// reattached, nothing lost or doubled; only when no connection could be made
// for Grace does the host's kernel end the generation.
type Resumable interface {
	Remote
	// Serve starts the unit with argv (klbr-kernel's command line, without
	// --listen, which Serve adds) and env.
	Serve(ctx context.Context, argv, env []string) error
	// Attach returns one connection's command (not yet started): its stdin
	// and stdout reach the unit's protocol socket. It connects to the host
	// first, again when its connection dropped.
	Attach(ctx context.Context) (*exec.Cmd, error)
	// Grace is how long the unit's kernel waits for a connection.
	Grace() time.Duration
}

// spawnRemote starts the worker on another host: the local command (an SSH
// session) gets the protocol socket as its stdin and stdout, and klbr-kernel
// --protocol-stdio on the far side hands the stream to Python as fd 3. The
// remote unit is the placement: it is in the host's klbr.slice with its
// limits from its first instruction, so there is no go-ahead.
func (w *Worker) spawnRemote(ctx context.Context, workerEnd *os.File) error {
	s := w.spec
	site := "-s"
	if s.NoSite {
		site = "-S"
	}
	if r, ok := s.Remote.(Resumable); ok {
		return w.spawnResumable(ctx, r, workerEnd, site)
	}
	argv := []string{s.Kernel, "--protocol-stdio", "--", s.Python, site, "-m", "klbr_runtime"}
	cmd, err := s.Remote.Command(ctx, argv, w.env())
	if err != nil {
		w.conn.Close()
		return fmt.Errorf("worker: remote: %w", err)
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = workerEnd, workerEnd, w.diag
	cmd.WaitDelay = 5 * time.Second
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := w.start(cmd); err != nil {
		w.conn.Close()
		return fmt.Errorf("worker: start the remote worker: %w", err)
	}
	return w.greet(ctx)
}

// killRemote stops the remote unit (the host's systemd kills every process
// of it), then ends the local session.
func (w *Worker) killRemote() {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := w.spec.Remote.Stop(ctx); err != nil {
		w.log.Warn("worker: stop the remote unit", "error", err)
	}
	if w.stream != nil {
		w.stream.Abort(fmt.Errorf("%w: killed", ErrDead))
		<-w.exited
		return
	}
	select {
	case <-w.exited:
	case <-time.After(3 * time.Second):
		_ = syscall.Kill(-w.cmd.Process.Pid, syscall.SIGKILL)
		<-w.exited
	}
}

// spawnResumable starts the unit, then keeps the worker's protocol stream
// attached to it over successive connections until the stream ends (the
// kernel ended it, or the worker was killed), or no connection could be made
// for the unit's grace and a little more (the kernel has ended the
// generation by then).
func (w *Worker) spawnResumable(ctx context.Context, r Resumable, workerEnd *os.File, site string) error {
	s := w.spec
	argv := []string{s.Kernel, "--grace", r.Grace().String(), "--", s.Python, site, "-m", "klbr_runtime"}
	if err := r.Serve(ctx, argv, w.env()); err != nil {
		w.conn.Close()
		return fmt.Errorf("worker: start the remote unit: %w", err)
	}
	return w.attachResumable(ctx, r, workerEnd, resume.Config{})
}

// Reattach takes over a generation that outlived the klbr-core that started
// it: spec.Remote's unit on a host (a Resumable), whose kernel kept Python
// and its state while no one was attached. Nothing is started. The stream
// begins a new epoch (resume.Config.NewEpoch: what the dead klbr-core had in
// flight is gone, both ways), the worker is told so (reattach: it
// interrupts the cell it was running and ends its pending host requests),
// and its hello, which must name spec's role, session and generation, is
// the handshake. When that fails (no kernel listens on the unit's socket,
// another worker answers, no hello in time), the unit is stopped and the
// error says why.
func Reattach(ctx context.Context, spec Spec) (*Worker, error) {
	r, ok := spec.Remote.(Resumable)
	if !ok {
		return nil, errors.New("worker: reattach: only a worker on a host outlives klbr-core")
	}
	// The dead klbr-core's connection may still look attached to the
	// kernel until its keepalives run out (15 s): the new epoch waits.
	spec.Handshake = max(spec.Handshake, 30*time.Second)
	w := newWorker(spec)
	w.reattaching = true
	workerEnd, err := w.socketpair()
	if err != nil {
		return nil, err
	}
	defer workerEnd.Close()
	if err := w.attachResumable(ctx, r, workerEnd, resume.Config{NewEpoch: true}); err != nil {
		return nil, err
	}
	return w, nil
}

// attachResumable keeps the worker's protocol stream (a new one, of cfg)
// attached to the unit, then greets the worker.
func (w *Worker) attachResumable(ctx context.Context, r Resumable, workerEnd *os.File, cfg resume.Config) error {
	fc, err := net.FileConn(workerEnd)
	if err != nil {
		w.conn.Close()
		return fmt.Errorf("worker: %w", err)
	}
	st := resume.New(cfg)
	w.stream = st
	fromKernel := make(chan struct{})
	go func() {
		_, _ = io.Copy(st, fc)
		_ = st.CloseWrite()
	}()
	go func() {
		_, _ = io.Copy(fc, st)
		fc.Close()
		close(fromKernel)
	}()
	go w.keepAttached(r, st, fromKernel)
	if w.reattaching {
		if err := w.send(&Frame{Type: TypeReattach}); err != nil {
			w.Kill()
			return fmt.Errorf("worker: reattach: %w", err)
		}
	}
	return w.greet(ctx)
}

// keepAttached makes connections for st until it is over, then marks the
// worker exited.
func (w *Worker) keepAttached(r Resumable, st *resume.Stream, fromKernel <-chan struct{}) {
	runtime.LockOSThread() // the sessions' Pdeathsig follows this thread
	defer runtime.UnlockOSThread()
	giveUp := r.Grace() + 30*time.Second
	pause := 50 * time.Millisecond
	var why error
	quiet := false // a failed attempt was logged since the last connection
	for {
		select {
		case <-fromKernel:
			why = errors.New("the worker ended its protocol stream")
		default:
		}
		if why != nil {
			break
		}
		if err := st.Err(); err != nil {
			why = err
			break
		}
		if since, detached := st.Detached(); detached && time.Since(since) > giveUp {
			why = fmt.Errorf("no connection to the host for %s: the host's kernel has ended the generation", giveUp.Round(time.Second))
			st.Abort(why)
			break
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		cmd, err := r.Attach(ctx)
		cancel()
		if err == nil {
			cmd.Stderr = w.diag
			cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
			var c io.ReadWriteCloser
			if c, err = resume.StartCommand(cmd); err == nil {
				began := time.Now()
				err = st.Attach(c)
				if time.Since(began) > 2*time.Second {
					pause, quiet = 50*time.Millisecond, false
				}
				if cmd.ProcessState != nil && cmd.ProcessState.ExitCode() == kernel.ExitNoListener && st.ID() != (resume.ID{}) {
					// The connection works and the kernel this stream was
					// attached to no longer listens: it has ended.
					why = errors.New("the worker's kernel on the host has ended (no one listens on its protocol socket)")
					st.Abort(why)
					break
				}
			}
		}
		if err != nil && st.Err() == nil && !quiet {
			w.log.Info("worker: the remote connection ended; attaching again until the host's down grace has passed", "error", err)
			quiet = true
		}
		select {
		case <-fromKernel:
		case <-time.After(pause):
		}
		pause = min(2*pause, time.Second)
	}
	w.log.Warn("worker: the remote worker is gone", "why", why)
	w.exitErr = why
	close(w.exited)
	w.markDead(fmt.Errorf("%w: %v", ErrDead, why))
	go w.Kill() // stops the unit
}
