// Package unixsock makes the Unix sockets klbr serves on and tells a handler
// who is on the other end (SO_PEERCRED).
package unixsock

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"

	"golang.org/x/sys/unix"
)

// Listen binds a Unix stream socket at path with the given mode. A leftover
// socket file from a dead process is replaced; any other file is an error.
// The caller must hold the data directory lock, which is what makes a
// leftover socket safe to remove.
func Listen(path string, mode fs.FileMode) (*net.UnixListener, error) {
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != fs.ModeSocket {
			return nil, fmt.Errorf("listen %s: a file that is not a socket is in the way", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("listen %s: remove stale socket: %w", path, err)
		}
	}
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	if err := os.Chmod(path, mode); err != nil {
		l.Close()
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	return l, nil
}

// Cred is the peer process of a connection, as the kernel saw it at connect.
type Cred struct {
	PID int32
	UID uint32
	GID uint32
	// Worker, when set, says why the peer is a klbr worker or a descendant of one (see
	// ConnContextClassified); such a peer holds no operator or ingress authority.
	Worker string
}

type credKey struct{}

// ConnContext is an http.Server ConnContext that records the peer's
// credentials of Unix connections in the request context.
func ConnContext(ctx context.Context, c net.Conn) context.Context {
	uc, ok := unwrap(c).(*net.UnixConn)
	if !ok {
		return ctx
	}
	cred, err := PeerCred(uc)
	if err != nil {
		return ctx
	}
	return context.WithValue(ctx, credKey{}, cred)
}

// ConnContextClassified is ConnContext that also asks classify (placement.WorkerOf)
// whether the peer is a worker. The peer is named by a pidfd (SO_PEERPIDFD, Linux 6.5),
// checked alive after classify has looked at /proc/<pid>: a peer that exited in between,
// whose pid might now be someone else's, counts as a worker (refused), not as whoever
// holds the pid now.
func ConnContextClassified(classify func(pid int) string) func(context.Context, net.Conn) context.Context {
	return func(ctx context.Context, c net.Conn) context.Context {
		uc, ok := unwrap(c).(*net.UnixConn)
		if !ok {
			return ctx
		}
		cred, err := PeerCred(uc)
		if err != nil {
			return ctx
		}
		pidfd := peerPidfd(uc)
		cred.Worker = classify(int(cred.PID))
		if pidfd >= 0 {
			if err := unix.PidfdSendSignal(pidfd, 0, nil, 0); err == unix.ESRCH && cred.Worker == "" {
				cred.Worker = "exited before it could be told apart from a worker"
			}
			unix.Close(pidfd)
		}
		return context.WithValue(ctx, credKey{}, cred)
	}
}

// peerPidfd returns a pidfd of the peer, or -1 where the kernel has no SO_PEERPIDFD.
func peerPidfd(c *net.UnixConn) int {
	raw, err := c.SyscallConn()
	if err != nil {
		return -1
	}
	fd := -1
	raw.Control(func(s uintptr) {
		if v, err := unix.GetsockoptInt(int(s), unix.SOL_SOCKET, unix.SO_PEERPIDFD); err == nil {
			fd = v
		}
	})
	return fd
}

// unwrap returns the connection beneath wrappers such as LimitListener's.
func unwrap(c net.Conn) net.Conn {
	for {
		u, ok := c.(interface{ Unwrap() net.Conn })
		if !ok {
			return c
		}
		c = u.Unwrap()
	}
}

// FromContext returns the peer recorded by ConnContext.
func FromContext(ctx context.Context) (Cred, bool) {
	c, ok := ctx.Value(credKey{}).(Cred)
	return c, ok
}

// PeerCred reads SO_PEERCRED of a Unix connection.
func PeerCred(c *net.UnixConn) (Cred, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return Cred{}, err
	}
	var uc *unix.Ucred
	var serr error
	if err := raw.Control(func(fd uintptr) {
		uc, serr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return Cred{}, err
	}
	if serr != nil {
		return Cred{}, fmt.Errorf("SO_PEERCRED: %w", serr)
	}
	if uc == nil {
		return Cred{}, errors.New("SO_PEERCRED: no credentials")
	}
	return Cred{PID: uc.Pid, UID: uc.Uid, GID: uc.Gid}, nil
}
