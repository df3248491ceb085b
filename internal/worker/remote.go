package worker

import (
	"context"
	"fmt"
	"os"
	"syscall"
	"time"
)

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
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := w.spec.Remote.Stop(ctx); err != nil {
		w.log.Warn("worker: stop the remote unit", "error", err)
	}
	select {
	case <-w.exited:
	case <-time.After(3 * time.Second):
		_ = syscall.Kill(-w.cmd.Process.Pid, syscall.SIGKILL)
		<-w.exited
	}
}
