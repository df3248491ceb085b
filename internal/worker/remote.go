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
	"sync"
	"sync/atomic"
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

// Tailer is a Remote that can read the end of its unit's output on the
// host (its kernel's and Python's stderr go there, not here): a worker that
// died there has its last words added to its diagnostics, as a local
// worker's stderr is.
type Tailer interface {
	Tail(ctx context.Context, n int) ([]byte, error)
}

// lastWordsBytes is how much of a dead remote worker's output is fetched.
const lastWordsBytes = 4 << 10

// lastWords adds the end of the remote unit's output to the diagnostics,
// unless the worker is being killed (its unit stopped on purpose).
func (w *Worker) lastWords() {
	t, ok := w.spec.Remote.(Tailer)
	if !ok || w.dropping.Load() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	tail, err := t.Tail(ctx, lastWordsBytes)
	if err != nil {
		w.log.Info("worker: read the remote worker's last output", "error", err)
		return
	}
	if len(tail) > 0 {
		fmt.Fprintf(w.diag, "\n[the worker's output on its host, last %d bytes]\n%s", len(tail), tail)
	}
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
	w.dropping.Store(true)
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
func (w *Worker) spawnResumable(ctx context.Context, r Resumable) error {
	s := w.spec
	site := "-s"
	if s.NoSite {
		site = "-S"
	}
	argv := []string{s.Kernel, "--grace", r.Grace().String(), "--", s.Python, site, "-m", "klbr_runtime"}
	st := resume.New(resume.Config{})
	sc := &streamConn{st: st, ended: make(chan struct{})}
	w.conn = sc
	if err := r.Serve(ctx, argv, w.env()); err != nil {
		st.Close()
		return fmt.Errorf("worker: start the remote unit: %w", err)
	}
	return w.attachResumable(ctx, r, st, sc)
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
	st := resume.New(resume.Config{NewEpoch: true})
	sc := &streamConn{st: st, ended: make(chan struct{})}
	w.conn = sc
	if err := w.attachResumable(ctx, r, st, sc); err != nil {
		return nil, err
	}
	return w, nil
}

// attachResumable keeps the worker's protocol stream st attached to the
// unit, then greets the worker through sc (a reattached worker is told so
// first).
func (w *Worker) attachResumable(ctx context.Context, r Resumable, st *resume.Stream, sc *streamConn) error {
	w.stream = st
	go w.keepAttached(r, st, sc.ended)
	if w.reattaching {
		if err := w.send(&Frame{Type: TypeReattach}); err != nil {
			w.Kill()
			return fmt.Errorf("worker: reattach: %w", err)
		}
	}
	return w.greet(ctx)
}

// streamConn is a resumable worker's stream as its protocol connection: the
// worker's frames go into the stream and come out of it with no socket and
// no copying goroutine between (each would cost a wake-up a frame).
type streamConn struct {
	st     *resume.Stream
	closed atomic.Bool
	once   sync.Once
	ended  chan struct{} // closed once Read met the stream's end or failure
}

func (c *streamConn) Read(p []byte) (int, error) {
	n, err := c.st.Read(p)
	if err != nil {
		if c.closed.Load() {
			return n, net.ErrClosed
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			c.once.Do(func() { close(c.ended) })
		}
	}
	return n, err
}

func (c *streamConn) Write(p []byte) (int, error) {
	if c.closed.Load() {
		return 0, net.ErrClosed
	}
	return c.st.Write(p)
}

// Close ends what the worker sends (the kernel's Python reads its end) and
// wakes a waiting Read, which returns net.ErrClosed; the stream itself
// goes on until the kernel ends it or the worker is killed.
func (c *streamConn) Close() error {
	if !c.closed.Swap(true) {
		_ = c.st.CloseWrite()
		_ = c.st.SetReadDeadline(time.Now())
	}
	return nil
}

func (c *streamConn) SetReadDeadline(t time.Time) error  { return c.st.SetReadDeadline(t) }
func (c *streamConn) SetWriteDeadline(t time.Time) error { return c.st.SetWriteDeadline(t) }

// Forwarder is a Resumable whose unit's socket its host's connection can
// reach with no relay process (hosts.WorkerUnit: OpenSSH's stream-local
// forwarding to the kernel's handle on its socket). A nil connection with
// no error says it cannot be forwarded to: Attach reaches it.
type Forwarder interface {
	Forward(ctx context.Context) (net.Conn, error)
}

// heardConn notes whether anything arrived on its connection.
type heardConn struct {
	io.ReadWriteCloser
	heard atomic.Bool
}

func (c *heardConn) Read(p []byte) (int, error) {
	n, err := c.ReadWriteCloser.Read(p)
	if n > 0 && !c.heard.Load() {
		c.heard.Store(true)
	}
	return n, err
}

// dial makes one connection to the unit's socket: forwarded by the host's
// connection when r can (cmd nil), else, or with relay, through a session
// running the relay (klbr-kernel --attach), whose exit status cmd holds
// once the connection has ended.
func (w *Worker) dial(r Resumable, relay bool) (*heardConn, *exec.Cmd, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if f, ok := r.(Forwarder); ok && !relay {
		c, err := f.Forward(ctx)
		if err != nil {
			return nil, nil, err
		}
		if c != nil {
			return &heardConn{ReadWriteCloser: c}, nil, nil
		}
	}
	cmd, err := r.Attach(ctx)
	if err != nil {
		return nil, nil, err
	}
	cmd.Stderr = w.diag
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	c, err := resume.StartCommand(cmd)
	if err != nil {
		return nil, nil, err
	}
	return &heardConn{ReadWriteCloser: c}, cmd, nil
}

// keepAttached makes connections for st until it is over, then marks the
// worker exited.
func (w *Worker) keepAttached(r Resumable, st *resume.Stream, fromKernel <-chan struct{}) {
	runtime.LockOSThread() // the sessions' Pdeathsig follows this thread
	defer runtime.UnlockOSThread()
	giveUp := r.Grace() + 30*time.Second
	pause := 50 * time.Millisecond
	var why error
	quiet := false     // a failed attempt was logged since the last connection
	relayNext := false // the next attempt goes through the relay
	misses := 0        // times the relay reached the kernel a forward did not
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
			w.markDead(fmt.Errorf("%w: %v", ErrDead, why)) // before the stream's end says only EOF
			st.Abort(why)
			break
		}
		c, cmd, err := w.dial(r, relayNext || misses >= 3)
		if err == nil {
			began := time.Now()
			err = st.Attach(c)
			if time.Since(began) > 2*time.Second {
				pause, quiet = 50*time.Millisecond, false
			}
			switch {
			case cmd == nil && c.heard.Load():
				relayNext, misses = false, 0
			case cmd == nil:
				// The forward reached no kernel: the relay says whether
				// one still listens (and reaches it where the host's sshd
				// does not forward).
				relayNext = true
			case relayNext && c.heard.Load():
				relayNext = false
				if misses++; misses == 3 {
					w.log.Info("worker: the host does not forward to the worker's socket; its connections go through the relay")
				}
			default:
				relayNext = false
			}
			if cmd != nil && cmd.ProcessState != nil && cmd.ProcessState.ExitCode() == kernel.ExitNoListener && st.ID() != (resume.ID{}) {
				// The connection works and the kernel this stream was
				// attached to no longer listens: it has ended.
				why = errors.New("the worker's kernel on the host has ended (no one listens on its protocol socket)")
				w.markDead(fmt.Errorf("%w: %v", ErrDead, why))
				st.Abort(why)
				break
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
	w.markDead(fmt.Errorf("%w: %v", ErrDead, why))
	w.lastWords() // Execute's deathReason waits for exited
	w.exitErr = why
	close(w.exited)
	go w.Kill() // stops the unit
}
