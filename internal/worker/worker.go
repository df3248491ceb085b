// Package worker is the host side of the worker protocol: it starts a Python
// worker through klbr-kernel, has it placed before it runs anything, checks
// its handshake, runs cells and hook invocations against absolute deadlines,
// bounds their output, answers their host requests, and stops or kills it
// without ever waiting on it.
package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/klbr-dev/klbr/internal/artifacts"
	"github.com/klbr-dev/klbr/internal/kernel"
	"github.com/klbr-dev/klbr/internal/placement"
	"github.com/klbr-dev/klbr/internal/resume"
)

// Roles.
const (
	RoleWorkbench = "workbench"
	RoleHooks     = "hooks"
)

// Errors callers branch on.
var (
	ErrDead    = errors.New("worker is not running")
	ErrBusy    = errors.New("worker is already running a cell")
	ErrTimeout = errors.New("deadline passed")

	errNoArtifactStore = errors.New("no artifact store configured")
)

// Spec says what to start.
type Spec struct {
	Role       string
	Session    string
	Generation int64

	Kernel     string // the klbr-kernel binary
	Python     string // the interpreter binary (resolved, not a shim)
	RuntimeSrc string // the klbr-runtime src directory, put on PYTHONPATH
	Workspace  string
	Behavior   string // hooks role: directory holding klbr_hooks
	Skills     string // skills revision of this generation
	Env        []string
	// NoSite starts Python without the site module (-S): standard library
	// only, and about 35 ms less start-up. The hooks role uses it.
	NoSite bool

	Placer placement.Placer
	Limits placement.Limits
	// Remote, when set, runs the worker on another host (see Remote); Kernel,
	// Python and RuntimeSrc then name the host's, Workspace is the remote
	// unit's directory when empty, and Placer and Sandbox do not apply.
	Remote Remote
	// Sandbox is what klbr-kernel takes away from Python before it starts (kernel.Sandbox);
	// the zero value takes nothing (tests).
	Sandbox kernel.Sandbox

	Artifacts      *artifacts.Store
	PreviewBytes   int           // 0 means DefaultPreviewBytes
	PreviewFrames  int           // 0 means DefaultPreviewFrames
	Handshake      time.Duration // 0 means 10s
	InterruptGrace time.Duration // 0 means 2s
	RequestQueue   int           // bound of pending host requests; 0 means 64

	// LateOutput receives output that arrives after its execution ended
	// (background tasks). It must not block.
	LateOutput func(execution string, ch OutputChunk)
	Log        *slog.Logger
}

// Remote starts a worker on another host: klbr-kernel there, with
// --protocol-stdio, in a transient unit of the host's systemd.
type Remote interface {
	// Command returns the (not yet started) local command whose stdin and
	// stdout are the remote kernel's: the protocol stream. argv is the
	// kernel's command line, env the Python process's variables.
	Command(ctx context.Context, argv, env []string) (*exec.Cmd, error)
	// Stop stops the remote unit and every process of it.
	Stop(ctx context.Context) error
}

// Handler answers a running execution's host requests.
type Handler interface {
	HandleRequest(ctx context.Context, r Request) (json.RawMessage, error)
}

// Request is a host request from Python.
type Request struct {
	Execution string
	ID        int64
	Op        string
	Args      json.RawMessage
}

// RequestError is a refusal a Handler returns with a stable code.
type RequestError struct {
	Code    string
	Message string
}

func (e *RequestError) Error() string { return e.Code + ": " + e.Message }

// Outcome is how an execution ended.
type Outcome struct {
	Execution      string          `json:"execution"`
	Generation     int64           `json:"generation"`
	Status         string          `json:"status"` // ok, error, cancelled, yielded
	Value          *string         `json:"value,omitempty"`
	ValueTruncated bool            `json:"value_truncated,omitempty"`
	Error          *ErrorInfo      `json:"error,omitempty"`
	Yield          json.RawMessage `json:"yield,omitempty"`
	Output         Output          `json:"output"`
	// Reset is set when the worker was killed or died during the cell: its
	// Python heap is gone and the next cell needs a new generation.
	Reset bool `json:"reset,omitempty"`
	// Presented, when set, is how the model is shown this outcome
	// (result.present); the rest of the outcome is stored regardless.
	Presented *string `json:"presented,omitempty"`
}

// protoConn is what the worker's protocol travels over: the socket of a
// local or piped worker (*net.UnixConn), or a resumable worker's stream.
type protoConn interface {
	io.ReadWriteCloser
	SetReadDeadline(time.Time) error
	SetWriteDeadline(time.Time) error
}

// Worker is one generation of one role of one session.
type Worker struct {
	spec      Spec
	log       *slog.Logger
	cmd       *exec.Cmd
	conn      protoConn // the protocol: a socket, or a resumable stream
	placement placement.Placement
	hello     Frame
	diag      *ring // recent stdout+stderr of the kernel and Python

	writeMu sync.Mutex // serializes frames to the worker

	mu       sync.Mutex // guards cur, hooks, deadErr
	cur      *execution
	hooks    map[string]chan *Frame
	deadErr  error
	dead     chan struct{} // closed once the worker is unusable
	exited   chan struct{} // closed once the kernel process is reaped
	exitErr  error         // set before exited closes
	requests chan *Frame
	stopOnce sync.Once
	stopping atomic.Bool    // Stop was called: the end of the stream is expected
	stream   *resume.Stream // a resumable remote worker's protocol stream
	dropping atomic.Bool    // Kill is stopping the remote unit: its end needs no last words
	// reattaching: Reattach took over a generation a predecessor of this
	// klbr-core started (set before the handshake, read only by it).
	reattaching bool
	killOnce    sync.Once
	killed      chan struct{} // closed once the tree is gone and the placement released
	wg          sync.WaitGroup
}

type execution struct {
	id      string
	ctx     context.Context
	handler Handler
	out     *collector
	outcome chan *Frame // buffered(1)
}

// Start spawns the kernel, places it, gives it the go-ahead and waits for
// the worker's hello, all before ctx ends.
func Start(ctx context.Context, spec Spec) (*Worker, error) {
	w := newWorker(spec)
	if err := w.spawn(ctx); err != nil {
		return nil, err
	}
	return w, nil
}

func newWorker(spec Spec) *Worker {
	if spec.Handshake <= 0 {
		spec.Handshake = 10 * time.Second
	}
	if spec.InterruptGrace <= 0 {
		spec.InterruptGrace = 2 * time.Second
	}
	if spec.PreviewBytes <= 0 {
		spec.PreviewBytes = DefaultPreviewBytes
	}
	if spec.PreviewFrames <= 0 {
		spec.PreviewFrames = DefaultPreviewFrames
	}
	if spec.RequestQueue <= 0 {
		spec.RequestQueue = 64
	}
	if spec.Log == nil {
		spec.Log = slog.New(slog.DiscardHandler)
	}
	w := &Worker{
		spec: spec, diag: newRing(64 << 10),
		log:   spec.Log.With("role", spec.Role, "session", spec.Session, "generation", spec.Generation),
		hooks: map[string]chan *Frame{}, dead: make(chan struct{}), exited: make(chan struct{}), killed: make(chan struct{}),
		requests: make(chan *Frame, spec.RequestQueue),
	}
	return w
}

// socketpair makes the protocol socket: w.conn is klbr-core's end, the
// other end is returned (the caller closes it).
func (w *Worker) socketpair() (*os.File, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("worker: socketpair: %w", err)
	}
	hostEnd := os.NewFile(uintptr(fds[0]), "protocol-host")
	workerEnd := os.NewFile(uintptr(fds[1]), "protocol-worker")
	fc, err := net.FileConn(hostEnd)
	hostEnd.Close()
	if err != nil {
		workerEnd.Close()
		return nil, fmt.Errorf("worker: %w", err)
	}
	w.conn = fc.(*net.UnixConn)
	return workerEnd, nil
}

func (w *Worker) spawn(ctx context.Context) error {
	if r, ok := w.spec.Remote.(Resumable); ok {
		return w.spawnResumable(ctx, r)
	}
	workerEnd, err := w.socketpair()
	if err != nil {
		return err
	}
	defer workerEnd.Close()
	s := w.spec
	if s.Remote != nil {
		return w.spawnRemote(ctx, workerEnd)
	}
	goRead, goWrite, err := os.Pipe()
	if err != nil {
		w.conn.Close()
		return fmt.Errorf("worker: go-ahead pipe: %w", err)
	}
	defer goRead.Close()

	pspec := placement.Spec{Role: s.Role, Session: s.Session, Generation: s.Generation, Limits: s.Limits}
	var args []string
	if s.Placer != nil {
		args = append(args, s.Placer.KernelArgs(pspec)...)
	}
	args = append(args, s.Sandbox.Args()...)
	// -s: no user site-packages; the runtime comes from PYTHONPATH only.
	site := "-s"
	if s.NoSite {
		site = "-S"
	}
	args = append(args, "--protocol-fd", "3", "--go-ahead-fd", "4", "--", s.Python, site, "-m", "klbr_runtime")
	cmd := exec.Command(s.Kernel, args...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}, w.env()...)
	cmd.Dir = s.Workspace
	cmd.ExtraFiles = []*os.File{workerEnd, goRead}
	cmd.Stdout, cmd.Stderr = w.diag, w.diag
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := w.start(cmd); err != nil {
		goWrite.Close()
		w.conn.Close()
		return fmt.Errorf("worker: start %s: %w", s.Kernel, err)
	}

	// Place the kernel before it may start anything.
	if s.Placer != nil {
		pl, err := s.Placer.Place(ctx, cmd.Process.Pid, pspec)
		if err != nil {
			goWrite.Close() // EOF without a byte: the kernel exits without starting Python
			w.Kill()
			return fmt.Errorf("worker: place: %w", err)
		}
		w.placement = pl
	}
	if _, err := goWrite.Write([]byte{1}); err != nil {
		goWrite.Close()
		w.Kill()
		return fmt.Errorf("worker: go-ahead: %w", err)
	}
	goWrite.Close()

	return w.greet(ctx)
}

// env is the Python process's environment (klbr-kernel passes only these).
func (w *Worker) env() []string {
	s := w.spec
	return append([]string{
		"LANG=C.UTF-8",
		"KLBR_ROLE=" + s.Role, "KLBR_SESSION=" + s.Session, "KLBR_GENERATION=" + strconv.FormatInt(s.Generation, 10),
		"KLBR_PROTOCOL_FD=3", "KLBR_WORKSPACE=" + s.Workspace, "KLBR_BEHAVIOR_DIR=" + s.Behavior,
		"KLBR_SKILLS_REVISION=" + s.Skills, "PYTHONPATH=" + s.RuntimeSrc,
		"PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1", "PYTHONSAFEPATH=1",
	}, s.Env...)
}

// greet waits for the hello, then serves the worker.
func (w *Worker) greet(ctx context.Context) error {
	if err := w.handshake(ctx); err != nil {
		w.Kill()
		return fmt.Errorf("worker: handshake: %w (recent output: %q)", err, w.diag.String())
	}
	w.wg.Add(2)
	go w.readLoop()
	go w.serveRequests()
	return nil
}

// start starts the kernel from a goroutine locked to its OS thread until the
// kernel is reaped. Pdeathsig follows the thread that forked the child (see
// go.dev/issue/27505), and the runtime ends a locked thread when its
// goroutine exits; holding the lock until Wait returns means the signal fires
// only when klbr-core itself dies.
func (w *Worker) start(cmd *exec.Cmd) error {
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		w.cmd = cmd
		started <- nil
		err := cmd.Wait()
		w.exitErr = err
		close(w.exited)
		w.markDead(fmt.Errorf("%w: exited (%v)", ErrDead, err))
		go w.Kill() // releases the placement
	}()
	return <-started
}

func (w *Worker) handshake(ctx context.Context) error {
	deadline := time.Now().Add(w.spec.Handshake)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	w.conn.SetReadDeadline(deadline)
	defer w.conn.SetReadDeadline(time.Time{})
	f, err := ReadFrame(w.conn)
	// A worker taken over (Reattach) may send frames of what it did before
	// it read reattach (a cell's output, its outcome) ahead of its hello:
	// they belong to a predecessor's cells, recorded lost, and are dropped.
	for skipped := 0; err == nil && w.reattaching && f.Type != TypeHello && skipped < 100000; skipped++ {
		f, err = ReadFrame(w.conn)
	}
	if err != nil {
		select {
		case <-w.exited:
			return fmt.Errorf("%w: the worker exited before saying hello (%v)", ErrDead, w.exitErr)
		default:
		}
		if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
			select {
			case <-w.exited:
			case <-time.After(time.Second):
			}
			return fmt.Errorf("%w: the worker closed the protocol socket before saying hello (%v)", ErrDead, w.exitErr)
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return fmt.Errorf("%w: no hello within %s", ErrTimeout, time.Until(deadline).Round(time.Millisecond)+w.spec.Handshake)
		}
		return err
	}
	switch {
	case f.Type != TypeHello:
		return fmt.Errorf("%w: first frame is %q, want hello", ErrProtocol, f.Type)
	case f.V != ProtocolVersion || f.Protocol != ProtocolVersion:
		return fmt.Errorf("%w: worker speaks protocol %d/%d, host %d", ErrProtocol, f.V, f.Protocol, ProtocolVersion)
	case f.Role != w.spec.Role:
		return fmt.Errorf("%w: worker says role %q, want %q", ErrProtocol, f.Role, w.spec.Role)
	case f.Session != w.spec.Session || f.Generation != w.spec.Generation:
		return fmt.Errorf("%w: worker says %s/%d, want %s/%d", ErrProtocol, f.Session, f.Generation, w.spec.Session, w.spec.Generation)
	}
	w.hello = *f
	return nil
}

// Hello is the worker's handshake.
func (w *Worker) Hello() Frame { return w.hello }

// Generation is the worker's generation.
func (w *Worker) Generation() int64 { return w.spec.Generation }

// Diagnostics returns the recent output of the kernel and Python.
func (w *Worker) Diagnostics() string { return w.diag.String() }

// Dead is closed once the worker cannot be used any more.
func (w *Worker) Dead() <-chan struct{} { return w.dead }

// Done is closed once the worker's whole tree is gone and its placement
// released (after Kill, or after Stop's grace).
func (w *Worker) Done() <-chan struct{} { return w.killed }

// Exited is closed once the kernel process has been reaped.
func (w *Worker) Exited() <-chan struct{} { return w.exited }

// Err says why the worker is dead, or nil.
func (w *Worker) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.deadErr
}

func (w *Worker) markDead(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.deadErr != nil {
		return
	}
	w.deadErr = err
	close(w.dead)
	w.conn.Close()
}

func (w *Worker) send(f *Frame) error {
	f.V, f.Session, f.Generation = ProtocolVersion, w.spec.Session, w.spec.Generation
	w.writeMu.Lock()
	defer w.writeMu.Unlock()
	w.conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if err := WriteFrame(w.conn, f); err != nil {
		w.markDead(fmt.Errorf("%w: write %s: %v", ErrDead, f.Type, err))
		return err
	}
	return nil
}

// readLoop is the only reader of the protocol socket.
func (w *Worker) readLoop() {
	defer w.wg.Done()
	defer close(w.requests)
	for {
		f, err := ReadFrame(w.conn)
		if err != nil {
			select {
			case <-w.dead: // we closed it
			default:
				if !w.stopping.Load() {
					w.log.Warn("worker: protocol stream ended", "error", err, "diagnostics", w.diag.String())
				}
				w.markDead(fmt.Errorf("%w: %v", ErrDead, err))
				if errors.Is(err, ErrProtocol) {
					w.Kill()
				}
			}
			return
		}
		if f.V != ProtocolVersion || f.Session != w.spec.Session || f.Generation != w.spec.Generation {
			w.log.Warn("worker: frame of another version, session or generation", "v", f.V, "frame_session", f.Session, "frame_generation", f.Generation)
			w.markDead(fmt.Errorf("%w: frame from %s/%d (v%d)", ErrProtocol, f.Session, f.Generation, f.V))
			w.Kill()
			return
		}
		if err := w.dispatch(f); err != nil {
			w.log.Warn("worker: bad frame", "error", err)
			w.markDead(err)
			w.Kill()
			return
		}
	}
}

func (w *Worker) dispatch(f *Frame) error {
	switch f.Type {
	case TypeOutput:
		ch := OutputChunk{Stream: f.Stream, Origin: f.Origin, Task: f.Task, Data: f.Data}
		if ch.Stream != "stdout" && ch.Stream != "stderr" {
			return fmt.Errorf("%w: output stream %q", ErrProtocol, f.Stream)
		}
		w.mu.Lock()
		cur := w.cur
		if cur != nil && cur.id == f.Execution {
			cur.out.add(ch)
			w.mu.Unlock()
			return nil
		}
		w.mu.Unlock()
		if w.spec.LateOutput != nil {
			w.spec.LateOutput(f.Execution, ch)
		}
	case TypeRequest:
		w.mu.Lock()
		current := w.cur != nil && w.cur.id == f.Execution
		w.mu.Unlock()
		if !current {
			return w.reply(f, nil, &RequestError{Code: "stale", Message: "execution " + f.Execution + " has finished"})
		}
		select {
		case w.requests <- f:
		default:
			return w.reply(f, nil, &RequestError{Code: "busy", Message: "too many host requests in flight"})
		}
	case TypeOutcome:
		w.mu.Lock()
		cur := w.cur
		w.mu.Unlock()
		if cur == nil || cur.id != f.Execution {
			w.log.Warn("worker: outcome for an execution that is not running", "execution", f.Execution)
			return nil
		}
		switch f.Status {
		case "ok", "error", "cancelled", "yielded":
		default:
			return fmt.Errorf("%w: outcome status %q", ErrProtocol, f.Status)
		}
		select {
		case cur.outcome <- f:
		default:
			return fmt.Errorf("%w: second outcome for %s", ErrProtocol, f.Execution)
		}
	case TypeHookResult:
		w.mu.Lock()
		ch := w.hooks[f.Invocation]
		delete(w.hooks, f.Invocation)
		w.mu.Unlock()
		if ch != nil {
			ch <- f
		}
	default:
		return fmt.Errorf("%w: unexpected frame type %q from the worker", ErrProtocol, f.Type)
	}
	return nil
}

// serveRequests answers host requests in order of arrival, a few at a time.
func (w *Worker) serveRequests() {
	defer w.wg.Done()
	sem := make(chan struct{}, 4)
	var inflight sync.WaitGroup
	defer inflight.Wait()
	for f := range w.requests {
		w.mu.Lock()
		cur := w.cur
		w.mu.Unlock()
		if cur == nil || cur.id != f.Execution {
			w.reply(f, nil, &RequestError{Code: "stale", Message: "execution " + f.Execution + " has finished"})
			continue
		}
		sem <- struct{}{}
		inflight.Add(1)
		go func() {
			defer func() { <-sem; inflight.Done() }()
			var res json.RawMessage
			var err error
			if cur.handler == nil {
				err = &RequestError{Code: "unsupported", Message: "no host requests are served for this execution"}
			} else {
				res, err = cur.handler.HandleRequest(cur.ctx, Request{Execution: f.Execution, ID: f.Request, Op: f.Op, Args: f.Args})
			}
			w.reply(f, res, err)
		}()
	}
}

func (w *Worker) reply(req *Frame, res json.RawMessage, err error) error {
	ok := err == nil
	r := &Frame{Type: TypeHostReply, Execution: req.Execution, Request: req.Request, OK: &ok}
	if ok {
		if res == nil {
			res = json.RawMessage("{}")
		}
		r.Result = res
	} else {
		var re *RequestError
		if errors.As(err, &re) {
			r.Error = &ErrorInfo{Code: re.Code, Message: re.Message}
		} else {
			r.Error = &ErrorInfo{Code: "failed", Message: err.Error()}
		}
	}
	if ok && len(res) > MaxFrameBytes/2 {
		// An answer over the frame bound would kill the worker at the write;
		// the cell gets an error it can act on instead.
		if b, merr := json.Marshal(r); merr != nil || len(b) > MaxFrameBytes {
			no := false
			r.OK, r.Result = &no, nil
			r.Error = &ErrorInfo{Code: "too_large", Message: fmt.Sprintf(
				"%s: the answer is %d bytes, over the %d-byte bound of one host reply; ask for less (a smaller limit or max_bytes)",
				req.Op, len(res), MaxFrameBytes)}
		}
	}
	return w.send(r)
}
