package hosts

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strings"
)

// ErrNoForward says a worker unit's socket cannot be forwarded to (its
// kernel holds no handle on it: an older klbr-kernel, or it has ended):
// Attach's relay reaches it, or says that no kernel listens.
var ErrNoForward = errors.New("no forwardable handle on the unit's protocol socket")

// forward is one unit's socket forwarded by one master.
type forward struct {
	local, remote string
	master        *exec.Cmd
}

// Forward is one connection to a worker unit's protocol socket with no
// process between klbr-core and the link, nor between the link and the
// unit's kernel: the host's SSH master listens on a socket of klbr-core's
// own (in the control directory, 0600) and forwards each connection to it
// (direct-streamlocal, OpenSSH's stream-local forwarding) to
// /proc/PID/fd/N on the host, where N is the kernel's O_PATH handle on its
// socket (klbr-kernel --listen; the one socket its kernel holds by a
// path, where its listening socket and connections are "socket:[N]"):
// sshd connects to that inode, never to what a cell of the unit has put at
// the socket's path since, and a cell that moved the socket away does not
// unhook it. The forward is set
// up once per unit and master (one session to find the handle, one control
// command); Collect cancels it. ErrNoForward: use Attach.
func (e *Engine) Forward(ctx context.Context, host, unit string) (net.Conn, error) {
	c, err := e.conn(host)
	if err != nil {
		return nil, err
	}
	if err := CheckUnitName(unit); err != nil {
		return nil, err
	}
	if err := c.connect(ctx); err != nil {
		return nil, err
	}
	local, err := c.forward(ctx, unit)
	if err != nil {
		return nil, err
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", local)
	if err != nil {
		c.unforward(unit)
		return nil, fmt.Errorf("host %s: connect to the forward of %s: %w", c.h.Name, unit, err)
	}
	return conn, nil
}

// forward returns the local socket that the current master forwards to
// unit's socket, and sets it up when there is none.
func (c *conn) forward(ctx context.Context, unit string) (string, error) {
	c.fwdSetup.Lock()
	defer c.fwdSetup.Unlock()
	c.mu.Lock()
	m := c.master
	f, ok := c.fwds[unit]
	c.mu.Unlock()
	if ok && f.master == m {
		return f.local, nil
	}
	if ok {
		os.Remove(f.local) // its master is gone, and its forward with it
	}
	var out bytes.Buffer
	script := fmt.Sprintf(`u=%s
pid=$(systemctl show --property=MainPID --value -- "$u" 2>/dev/null)
case "$pid" in ''|0|*[!0-9]*) exit 0;; esac
for f in /proc/"$pid"/fd/*; do
  case "$(readlink -- "$f" 2>/dev/null)" in /*) [ -S "$f" ] && { echo "$f"; exit 0; };; esac
done
`, Quote(unit))
	if err := c.run(ctx, script, &limited{w: &out, n: 256}); err != nil {
		return "", err
	}
	remote, ok := parseHandle(out.String())
	if !ok {
		return "", fmt.Errorf("host %s: %s: %w", c.h.Name, unit, ErrNoForward)
	}
	local := fmt.Sprintf("%s/f%d.sock", c.e.controlDir, c.e.fwdSeq.Add(1))
	os.Remove(local)
	args := append(c.baseArgs(), "-O", "forward", "-L", local+":"+remote, "--", c.h.Target.Host)
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, c.e.cfg.SSH, args...)
	cmd.Stdout, cmd.Stderr = &limited{w: &stderr, n: 4096}, &limited{w: &stderr, n: 4096}
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("host %s: forward %s: %w: %v: %s", c.h.Name, unit, ErrNoForward, err, lastLine(stderr.String()))
	}
	c.mu.Lock()
	if c.fwds == nil {
		c.fwds = map[string]forward{}
	}
	c.fwds[unit] = forward{local: local, remote: remote, master: m}
	c.mu.Unlock()
	return local, nil
}

// unforward cancels unit's forward, if there is one.
func (c *conn) unforward(unit string) {
	c.fwdSetup.Lock()
	defer c.fwdSetup.Unlock()
	c.mu.Lock()
	f, ok := c.fwds[unit]
	delete(c.fwds, unit)
	m, exited := c.master, c.exited
	c.mu.Unlock()
	if !ok {
		return
	}
	defer os.Remove(f.local)
	if m != f.master {
		return
	}
	select {
	case <-exited:
		return
	default:
	}
	args := append(c.baseArgs(), "-O", "cancel", "-L", f.local+":"+f.remote, "--", c.h.Target.Host)
	_ = exec.Command(c.e.cfg.SSH, args...).Run()
}

var handlePath = regexp.MustCompile(`^/proc/[1-9][0-9]{0,9}/fd/[0-9]{1,9}$`)

// parseHandle reads the handle script's answer: one /proc/PID/fd/N line,
// or nothing.
func parseHandle(out string) (string, bool) {
	p := strings.TrimSuffix(out, "\n")
	if !handlePath.MatchString(p) {
		return "", false
	}
	return p, true
}
