package kernel

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/klbr-dev/klbr/internal/resume"
)

// listener is the state of --listen: the protocol stream outlives the connections that
// carry it (internal/resume), so that a worker on another host survives a dropped SSH
// connection and is reattached, not restarted.
type listener struct {
	stream *resume.Stream
	l      net.Listener
	path   string
	// handle is the socket's own inode, opened O_PATH without following a
	// link: /proc/PID/fd/N of this process names this socket and nothing
	// else, whatever is put at path later (the unit's directory is its
	// cells' to write), so a host's sshd may forward klbr-core's
	// connections there itself, with no relay process (hosts.Forward).
	handle *os.File
	grace  time.Duration
	// fromChild is closed once the child's end of the socket has been copied into the
	// stream to its end.
	fromChild chan struct{}
	stop      chan struct{}
}

// bridgeListen makes the protocol socket of --listen PATH: it returns the child's end,
// listens on PATH (0600) for one connection at a time (a newer one replaces the older), and
// carries the stream between the child and whichever connection is attached. With no
// connection for the grace period, the generation ends: the tree is killed as on SIGUSR1.
func (k *kernel) bridgeListen(path string, grace time.Duration) (*os.File, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("protocol socket: %w", err)
	}
	ours := os.NewFile(uintptr(fds[0]), "protocol-bridge")
	child := os.NewFile(uintptr(fds[1]), "protocol")
	_ = os.Remove(path) // the unit's own directory: only an earlier kernel of it left one
	old := unix.Umask(0o077)
	l, err := net.Listen("unix", path)
	unix.Umask(old)
	if err != nil {
		ours.Close()
		child.Close()
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	hfd, err := unix.Open(path, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	var st unix.Stat_t
	if err == nil {
		if err = unix.Fstat(hfd, &st); err == nil && st.Mode&unix.S_IFMT != unix.S_IFSOCK {
			err = fmt.Errorf("not the socket just made (mode %#o)", st.Mode)
		}
		if err != nil {
			unix.Close(hfd)
		}
	}
	if err != nil {
		l.Close()
		ours.Close()
		child.Close()
		return nil, fmt.Errorf("listen on %s: hold the socket: %w", path, err)
	}
	s := resume.New(resume.Config{Listener: true})
	ln := &listener{stream: s, l: l, path: path, handle: os.NewFile(uintptr(hfd), path), grace: grace,
		fromChild: make(chan struct{}), stop: make(chan struct{})}
	k.listen = ln
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				if err := s.Attach(c); err != nil && !errors.Is(err, resume.ErrReplaced) {
					k.log.Printf("connection ended: %v", err)
				}
			}()
		}
	}()
	go func() {
		_ = framesToStream(s, ours)
		_ = s.CloseWrite()
		close(ln.fromChild)
	}()
	go func() {
		_ = framesFromStream(ours, s)
		_ = unix.Shutdown(fds[0], unix.SHUT_WR)
	}()
	go ln.watch(k)
	return child, nil
}

// watch ends the generation once no connection has been attached for the grace period.
func (ln *listener) watch(k *kernel) {
	t := time.NewTicker(min(time.Second, ln.grace/4+time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-ln.stop:
			return
		case <-t.C:
		}
		if since, detached := ln.stream.Detached(); detached && time.Since(since) > ln.grace {
			k.log.Printf("no connection for %s: ending the generation", ln.grace)
			_ = unix.Kill(k.self, unix.SIGUSR1)
			return
		}
	}
}

// drainListen gives the child's last frames up to the grace period to reach the peer
// (which may have to reconnect first), then closes the socket. A tree ended by a signal (a
// stop of the unit: klbr-core stopping a generation, or one left over from a predecessor)
// has no peer waiting for them: the socket closes at once.
func (k *kernel) drainListen() {
	ln := k.listen
	if ln == nil {
		return
	}
	close(ln.stop)
	select {
	case <-ln.fromChild:
		if !k.signalled {
			ln.stream.WaitFlushed(ln.grace)
		}
	case <-time.After(time.Second):
	}
	ln.l.Close()
	ln.handle.Close()
	_ = os.Remove(ln.path)
	ln.stream.Close()
}

// attach is --attach PATH: a stateless relay between the kernel's stdin and stdout and the
// socket of a --listen kernel (the far end of an SSH session). It exits when either side
// ends.
func attach(path string) int {
	c, code, err := dialNoFollow(path)
	if err != nil {
		fmt.Fprintf(os.Stderr, "klbr-kernel: attach: %v\n", err)
		return code
	}
	done := make(chan struct{}, 2)
	go func() {
		_, _ = io.Copy(c, os.Stdin)
		done <- struct{}{}
	}()
	go func() {
		_, _ = io.Copy(os.Stdout, c)
		done <- struct{}{}
	}()
	<-done
	c.Close()
	return 0
}

// dialNoFollow connects to the socket at path, which must be a socket itself, never a
// symbolic link: the unit's directory is writable by its cells, and the relay runs outside
// the unit's containment, so a link there must not make it connect elsewhere (the login's
// service manager, another unit's socket). The socket is opened O_PATH|O_NOFOLLOW, checked,
// and connected to through /proc/self/fd, so the inode checked is the one connected to.
func dialNoFollow(path string) (net.Conn, int, error) {
	fd, err := unix.Open(path, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil, ExitNoListener, fmt.Errorf("%s: %w", path, err)
		}
		return nil, ExitKernel, fmt.Errorf("%s: %w", path, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, ExitKernel, fmt.Errorf("%s: %w", path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return nil, ExitKernel, fmt.Errorf("%s is not a socket (mode %#o): refusing it", path, st.Mode)
	}
	c, err := net.Dial("unix", fmt.Sprintf("/proc/self/fd/%d", fd))
	if err != nil {
		if errors.Is(err, unix.ECONNREFUSED) {
			return nil, ExitNoListener, fmt.Errorf("%s: %w", path, err)
		}
		return nil, ExitKernel, fmt.Errorf("%s: %w", path, err)
	}
	return c, 0, nil
}
