package hosts

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// conn is one host's multiplexed SSH connection.
type conn struct {
	e    *Engine
	h    Host
	sock string

	dial     sync.Mutex // held while connecting: one connect at a time
	fwdSetup sync.Mutex // held while a forward is set up or cancelled

	mu       sync.Mutex // guards master, exited, reserved, lastErr, since, tried, fwds
	master   *exec.Cmd
	exited   chan struct{} // closed when master exits
	reserved int
	lastErr  error
	since    time.Time // when lastErr began: the host's down since then
	tried    bool
	fwds     map[string]forward // by unit: its socket forwarded by master
}

// Error kinds of a host.
var (
	// ErrUnreachable: the connection could not be made (nothing was sent).
	ErrUnreachable = errors.New("host unreachable")
	// ErrHostKey: the host's key is unknown or changed; the connection was refused.
	ErrHostKey = errors.New("host key refused")
	// ErrAuth: the host refused the identity.
	ErrAuth = errors.New("host refused the login")
	// ErrLost: the command went out, but its connection broke before it
	// answered: what it did on the host is unknown until asked.
	ErrLost = errors.New("connection lost during a command")
)

// HostError is a failure to reach a host, with what fixes it.
type HostError struct {
	Host string
	Kind error // ErrUnreachable, ErrHostKey, ErrAuth, ErrLost
	Msg  string
	Fix  string // what the operator does next; "" when retrying is all
}

func (e *HostError) Error() string {
	s := fmt.Sprintf("host %s: %v: %s", e.Host, e.Kind, e.Msg)
	if e.Fix != "" {
		s += "; " + e.Fix
	}
	return s
}

func (e *HostError) Unwrap() error { return e.Kind }

// baseArgs are the options of every ssh this engine runs: nothing from
// ~/.ssh/config or an agent, strict host keys from the configured file.
func (c *conn) baseArgs() []string {
	t := c.h.Target
	return []string{"-F", "none",
		"-o", "BatchMode=yes",
		"-o", "StrictHostKeyChecking=yes",
		"-o", "UserKnownHostsFile=" + c.h.KnownHostsFile,
		"-o", "GlobalKnownHostsFile=/dev/null",
		"-o", "CheckHostIP=no",
		"-o", "UpdateHostKeys=no",
		"-o", "IdentitiesOnly=yes",
		"-o", "IdentityAgent=none",
		"-o", "IdentityFile=" + c.h.IdentityFile,
		"-o", "ConnectTimeout=" + strconv.Itoa(max(1, int(c.e.cfg.ConnectTimeout/time.Second))),
		"-o", "ServerAliveInterval=5",
		"-o", "ServerAliveCountMax=3",
		"-o", "ControlPath=" + c.sock,
		"-o", "LogLevel=ERROR",
		"-p", strconv.Itoa(t.Port),
		"-l", t.User,
	}
}

// connect starts the master if it is not running, and waits until its
// control socket answers.
func (c *conn) connect(ctx context.Context) error {
	c.dial.Lock()
	defer c.dial.Unlock()
	c.mu.Lock()
	if c.master != nil {
		select {
		case <-c.exited:
		default:
			c.mu.Unlock()
			return nil
		}
	}
	c.tried = true
	c.mu.Unlock()
	os.Remove(c.sock) // a socket a killed master left
	args := append(c.baseArgs(), "-M", "-N", "-o", "ControlPersist=no", "--", c.h.Target.Host)
	cmd := exec.Command(c.e.cfg.SSH, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &limited{w: &stderr, n: 16 << 10}
	cmd.Stdin = nil
	// The master dies with klbr-core (its units do not).
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM, Setpgid: true}
	c.e.dials.Add(1)
	if err := cmd.Start(); err != nil {
		return c.fail(&HostError{Host: c.h.Name, Kind: ErrUnreachable, Msg: "start ssh: " + err.Error(),
			Fix: "install the OpenSSH client (ssh) for klbr-core"})
	}
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	deadline := time.NewTimer(c.e.cfg.ConnectTimeout + 5*time.Second)
	defer deadline.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		if _, err := os.Stat(c.sock); err == nil {
			c.mu.Lock()
			c.master, c.exited, c.lastErr, c.since = cmd, exited, nil, time.Time{}
			c.mu.Unlock()
			c.e.cfg.Log.Info("hosts: connected", "host", c.h.Name)
			return nil
		}
		select {
		case <-exited:
			_ = waitErr
			return c.fail(classify(c.h, stderr.String()))
		case <-ctx.Done():
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-exited
			return ctx.Err()
		case <-deadline.C:
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-exited
			return c.fail(&HostError{Host: c.h.Name, Kind: ErrUnreachable, Msg: "no connection after " + (c.e.cfg.ConnectTimeout + 5*time.Second).String()})
		case <-tick.C:
		}
	}
}

func (c *conn) fail(err error) error {
	c.mu.Lock()
	if c.lastErr == nil {
		c.since = time.Now()
	}
	c.lastErr = err
	c.mu.Unlock()
	c.e.cfg.Log.Warn("hosts: cannot reach the host", "host", c.h.Name, "error", err)
	return err
}

// close ends the master.
func (c *conn) close() {
	c.dial.Lock()
	defer c.dial.Unlock()
	c.mu.Lock()
	m, exited := c.master, c.exited
	c.master = nil
	c.mu.Unlock()
	if m == nil {
		return
	}
	_ = m.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		_ = syscall.Kill(-m.Process.Pid, syscall.SIGKILL)
		<-exited
	}
	os.Remove(c.sock)
}

// classify turns the stderr of a failed connect into a HostError that says
// what to do.
func classify(h Host, stderr string) *HostError {
	name := h.Target.KnownHostsName()
	scan := fmt.Sprintf("ssh-keyscan -p %d %s >> %s", h.Target.Port, h.Target.Host, h.KnownHostsFile)
	verify := "compare its fingerprint (ssh-keygen -lf FILE) with the host's own (on the host: ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub)"
	last := lastLine(stderr)
	switch {
	case strings.Contains(stderr, "REMOTE HOST IDENTIFICATION HAS CHANGED"):
		return &HostError{Host: h.Name, Kind: ErrHostKey, Msg: "the host's key has changed since it was recorded in " + h.KnownHostsFile,
			Fix: fmt.Sprintf("if the host was reinstalled or its key rotated on purpose: ssh-keygen -R '%s' -f %s, then %s and %s; otherwise something may be impersonating it",
				name, h.KnownHostsFile, scan, verify)}
	case strings.Contains(stderr, "host key is known for") || strings.Contains(stderr, "Host key verification failed"):
		return &HostError{Host: h.Name, Kind: ErrHostKey, Msg: "the host's key is not in " + h.KnownHostsFile,
			Fix: fmt.Sprintf("record it: %s, then %s", scan, verify)}
	case strings.Contains(stderr, "Permission denied"):
		return &HostError{Host: h.Name, Kind: ErrAuth, Msg: last,
			Fix: fmt.Sprintf("authorize the public key of %s for %s on the host (its ~/.ssh/authorized_keys)", h.IdentityFile, h.Target.User)}
	case strings.Contains(stderr, "Load key") || strings.Contains(stderr, "no such identity"):
		return &HostError{Host: h.Name, Kind: ErrAuth, Msg: last, Fix: "check identity_file in klbr.toml: it must be a private key readable by klbr-core"}
	}
	if last == "" {
		last = "ssh exited without a connection"
	}
	return &HostError{Host: h.Name, Kind: ErrUnreachable, Msg: last}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if l := strings.TrimSpace(lines[i]); l != "" {
			return l
		}
	}
	return ""
}

// run runs a POSIX shell script on the host over the connection, its stdout
// to stdout (bounded by the caller). A failed connect is ErrUnreachable (or
// the key or login refusal): the script was not sent. A connection that
// breaks after the script went out is ErrLost. Otherwise the script's exit
// status is returned as *exec.ExitError with its stderr.
func (c *conn) run(ctx context.Context, script string, stdout io.Writer) error {
	return c.runIn(ctx, script, nil, stdout)
}

// session is the command that runs script on the host as a session of the
// master connection (which must be up): never a connection of its own.
func (c *conn) session(ctx context.Context, script string) *exec.Cmd {
	// The remote login shell parses the command line: hand the script to
	// /bin/sh as one quoted word whatever that shell is.
	args := append(c.baseArgs(), "-o", "ControlMaster=no", "-o", "ProxyCommand=false", "-T", "--", c.h.Target.Host,
		"exec /bin/sh -c "+Quote(c.prelude()+script))
	return exec.CommandContext(ctx, c.e.cfg.SSH, args...)
}

// runIn is run with stdin (nil: none) fed to the script.
func (c *conn) runIn(ctx context.Context, script string, stdin io.Reader, stdout io.Writer) error {
	if err := c.connect(ctx); err != nil {
		return err
	}
	cmd := c.session(ctx, script)
	var stderr bytes.Buffer
	cmd.Stdin = stdin
	cmd.Stdout = stdout
	cmd.Stderr = &limited{w: &stderr, n: 16 << 10}
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.ExitCode() == 255 {
		// ssh's own failure: the master went away under the command.
		c.mu.Lock()
		exited := c.exited
		c.mu.Unlock()
		select {
		case <-exited:
		case <-time.After(100 * time.Millisecond):
		}
		msg := lastLine(stderr.String())
		if msg == "" {
			msg = "the connection broke"
		}
		return c.fail(&HostError{Host: c.h.Name, Kind: ErrLost, Msg: msg})
	}
	if err != nil && ctx.Err() != nil {
		return &HostError{Host: c.h.Name, Kind: ErrLost, Msg: ctx.Err().Error()}
	}
	if err != nil {
		return &scriptError{host: c.h.Name, err: err, last: lastLine(stderr.String())}
	}
	c.mu.Lock()
	c.lastErr, c.since = nil, time.Time{}
	c.mu.Unlock()
	return nil
}

// scriptError is a script that ran on the host and failed: its exit and the last line
// of its stderr.
type scriptError struct {
	host string
	err  error // an *exec.ExitError
	last string
}

func (e *scriptError) Error() string {
	return fmt.Sprintf("host %s: %v: %s", e.host, e.err, e.last)
}

func (e *scriptError) Unwrap() error { return e.err }

// Quote makes s one word for a POSIX shell.
func Quote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// limited keeps the first n bytes written and discards the rest.
type limited struct {
	w io.Writer
	n int
}

func (l *limited) Write(p []byte) (int, error) {
	if l.n > 0 {
		k := min(len(p), l.n)
		_, _ = l.w.Write(p[:k])
		l.n -= k
	}
	return len(p), nil
}
