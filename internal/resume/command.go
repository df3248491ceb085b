package resume

import (
	"fmt"
	"io"
	"os/exec"
	"sync"
	"syscall"
)

// commandConn is a started command's stdin and stdout as one connection (an SSH session
// running klbr-kernel --attach).
type commandConn struct {
	io.Reader
	in   io.WriteCloser
	cmd  *exec.Cmd
	once sync.Once
}

// StartCommand starts cmd (its Stdin and Stdout must be unset) and returns its stdin and
// stdout as a connection; Close kills its process group if it has one of its own, else
// the process, and reaps it.
func StartCommand(cmd *exec.Cmd) (io.ReadWriteCloser, error) {
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("resume: %w", err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("resume: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("resume: start %s: %w", cmd.Path, err)
	}
	return &commandConn{Reader: out, in: in, cmd: cmd}, nil
}

func (c *commandConn) Write(p []byte) (int, error) { return c.in.Write(p) }

func (c *commandConn) Close() error {
	c.once.Do(func() {
		c.in.Close()
		if c.cmd.SysProcAttr != nil && c.cmd.SysProcAttr.Setpgid {
			_ = syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
		}
		_ = c.cmd.Process.Kill()
		_ = c.cmd.Wait()
	})
	return nil
}
