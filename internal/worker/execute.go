package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"
)

// Execute runs one cell and returns its outcome. If ctx ends first the cell
// is interrupted cooperatively; a cell that has not finished within the
// interrupt grace is killed with the whole worker, and the outcome says
// Reset. A worker that dies during the cell also gives a Reset outcome.
func (w *Worker) Execute(ctx context.Context, id, code string, h Handler) (*Outcome, error) {
	ex := &execution{id: id, ctx: ctx, handler: h, outcome: make(chan *Frame, 1),
		out: newCollector(w.spec.Artifacts, w.spec.PreviewBytes, w.spec.PreviewFrames)}
	w.mu.Lock()
	switch {
	case w.deadErr != nil:
		err := w.deadErr
		w.mu.Unlock()
		return nil, err
	case w.cur != nil:
		w.mu.Unlock()
		return nil, ErrBusy
	}
	w.cur = ex
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		w.cur = nil
		w.mu.Unlock()
	}()

	if err := w.send(&Frame{Type: TypeExecute, Execution: id, Code: code}); err != nil {
		return w.resetOutcome(ex, "WorkerDied", "the worker could not be given the cell: "+err.Error()), nil
	}
	select {
	case f := <-ex.outcome:
		return w.outcome(ex, f), nil
	case <-w.dead:
		return w.resetOutcome(ex, "WorkerDied", w.deathReason()), nil
	case <-ctx.Done():
	}
	// Interrupt: cooperative first, then the whole tree.
	w.send(&Frame{Type: TypeInterrupt, Execution: id})
	grace := time.NewTimer(w.spec.InterruptGrace)
	defer grace.Stop()
	select {
	case f := <-ex.outcome:
		return w.outcome(ex, f), nil
	case <-w.dead:
		return w.resetOutcome(ex, "WorkerDied", w.deathReason()), nil
	case <-grace.C:
	}
	w.Kill()
	return w.resetOutcome(ex, "KernelReset",
		fmt.Sprintf("the cell did not stop within %s of the interrupt; the worker was killed and its Python state is gone", w.spec.InterruptGrace)), nil
}

// Interrupt asks the running cell, if it is id, to stop.
func (w *Worker) Interrupt(id string) error {
	w.mu.Lock()
	running := w.cur != nil && w.cur.id == id
	w.mu.Unlock()
	if !running {
		return nil
	}
	return w.send(&Frame{Type: TypeInterrupt, Execution: id})
}

func (w *Worker) outcome(ex *execution, f *Frame) *Outcome {
	return &Outcome{
		Execution: ex.id, Generation: w.spec.Generation, Status: f.Status,
		Value: f.Value, ValueTruncated: f.ValueTruncated, Error: f.Error, Yield: f.Yield,
		Output: w.finishOutput(ex),
	}
}

func (w *Worker) resetOutcome(ex *execution, typ, msg string) *Outcome {
	status := "error"
	if ex.ctx.Err() != nil {
		status = "cancelled"
	}
	return &Outcome{
		Execution: ex.id, Generation: w.spec.Generation, Status: status, Reset: true,
		Error:  &ErrorInfo{Type: typ, Message: msg},
		Output: w.finishOutput(ex),
	}
}

func (w *Worker) finishOutput(ex *execution) Output {
	w.mu.Lock()
	defer w.mu.Unlock()
	return ex.out.finish()
}

// deathReason says why the worker died, as far as the host can tell.
func (w *Worker) deathReason() string {
	wait := time.Second
	if w.spec.Remote != nil {
		wait = 10 * time.Second // its last words are fetched from the host first
	}
	select {
	case <-w.exited:
	case <-time.After(wait):
	}
	reason := "the worker died"
	if w.exitErr != nil {
		reason += " (" + w.exitErr.Error() + ")"
	}
	if w.placement != nil {
		if oom, err := w.placement.OOMKilled(); err == nil && oom {
			reason += "; it was killed for exceeding its memory limit"
		}
	}
	if tail := w.diag.String(); tail != "" {
		if len(tail) > 2000 {
			tail = tail[len(tail)-2000:]
		}
		reason += "; recent output: " + tail
	}
	return reason
}

var invocationSeq atomic.Int64

// Invoke calls a policy hook (hooks role) and returns its result. It gives
// up at ctx's deadline; a worker that died or broke the protocol is an error.
func (w *Worker) Invoke(ctx context.Context, slot string, input json.RawMessage) (json.RawMessage, error) {
	id := "h" + strconv.FormatInt(invocationSeq.Add(1), 10)
	ch := make(chan *Frame, 1)
	w.mu.Lock()
	if w.deadErr != nil {
		err := w.deadErr
		w.mu.Unlock()
		return nil, err
	}
	w.hooks[id] = ch
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		delete(w.hooks, id)
		w.mu.Unlock()
	}()
	if err := w.send(&Frame{Type: TypeHookInvoke, Invocation: id, Slot: slot, Input: input}); err != nil {
		return nil, err
	}
	select {
	case f := <-ch:
		if f.OK == nil || !*f.OK {
			if f.Error == nil {
				return nil, errors.New("hook failed without an error")
			}
			return nil, fmt.Errorf("hook %s: %s: %s", slot, f.Error.Type, f.Error.Message)
		}
		return f.Result, nil
	case <-w.dead:
		return nil, fmt.Errorf("hook %s: %w", slot, w.Err())
	case <-ctx.Done():
		return nil, fmt.Errorf("hook %s: %w", slot, ErrTimeout)
	}
}

// Stop asks the worker to shut down and returns at once: it never waits on
// the worker. After a short grace the tree is killed and its placement
// released in the background.
func (w *Worker) Stop() {
	w.stopOnce.Do(func() {
		w.stopping.Store(true)
		go func() {
			done := make(chan struct{})
			go func() { w.send(&Frame{Type: TypeShutdown}); close(done) }()
			select {
			case <-w.exited:
			case <-time.After(500 * time.Millisecond):
			}
			w.Kill()
			<-done
		}()
	})
}

// Kill ends the worker's whole process tree now and releases its placement.
func (w *Worker) Kill() {
	w.markDead(fmt.Errorf("%w: killed", ErrDead))
	w.killOnce.Do(w.kill)
	<-w.killed
}

func (w *Worker) kill() {
	defer close(w.killed)
	if w.stream != nil {
		w.killRemote()
		return
	}
	if w.cmd == nil || w.cmd.Process == nil {
		return
	}
	if w.spec.Remote != nil {
		w.killRemote()
		return
	}
	select {
	case <-w.exited:
	default:
		// SIGUSR1 asks klbr-kernel to kill its whole tree now; it is the
		// subreaper of everything the worker started. SIGKILL to the kernel
		// would strand the tree, so it is only the last resort, and the
		// placement release below still kills what is inside the scope.
		w.cmd.Process.Signal(syscall.SIGUSR1)
		select {
		case <-w.exited:
		case <-time.After(3 * time.Second):
			w.log.Warn("worker: klbr-kernel did not exit on SIGUSR1; killing it")
			w.cmd.Process.Kill()
			<-w.exited
		}
	}
	if w.placement != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := w.placement.Release(ctx); err != nil {
			w.log.Warn("worker: release placement", "error", err)
		}
	}
}

// WaitDone waits until every worker in ws is Done, or the timeout passes.
// Shutdown uses it so that no placement outlives the daemon.
func WaitDone(ws []*Worker, timeout time.Duration) {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for _, w := range ws {
		select {
		case <-w.Done():
		case <-deadline.C:
			return
		}
	}
}
