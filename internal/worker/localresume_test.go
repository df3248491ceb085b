package worker

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// localResumable runs a --listen kernel on this machine (no systemd, no
// SSH): the resumable stream's own cost, connected directly (Forward) or
// through a local --attach relay (Attach).
type localResumable struct {
	dir string
	cmd *exec.Cmd
}

func (l *localResumable) sock() string { return filepath.Join(l.dir, "protocol.sock") }

func (l *localResumable) Command(ctx context.Context, argv, env []string) (*exec.Cmd, error) {
	return nil, os.ErrInvalid // only Serve starts it
}
func (l *localResumable) Stop(ctx context.Context) error {
	if l.cmd != nil && l.cmd.Process != nil {
		syscall.Kill(-l.cmd.Process.Pid, syscall.SIGKILL)
		l.cmd.Wait()
	}
	return nil
}
func (l *localResumable) Serve(ctx context.Context, argv, envv []string) error {
	argv = append([]string{env.Kernel, "--listen", l.sock()}, argv[1:]...)
	for i, a := range argv {
		if a == "python3" {
			argv[i] = env.Python
		}
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, envv...)
	cmd.Dir = l.dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return err
	}
	l.cmd = cmd
	for range 200 {
		if _, err := os.Stat(l.sock()); err == nil {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return os.ErrNotExist
}
func (l *localResumable) Attach(ctx context.Context) (*exec.Cmd, error) {
	return exec.Command(env.Kernel, "--attach", l.sock()), nil
}
func (l *localResumable) Grace() time.Duration { return time.Minute }

// localDirect connects to the socket itself, as a forward does.
type localDirect struct{ *localResumable }

func (l localDirect) Forward(ctx context.Context) (net.Conn, error) {
	return net.Dial("unix", l.sock())
}
