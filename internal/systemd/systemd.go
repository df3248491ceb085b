// Package systemd is klbr-core's side of its service manager: the listening sockets systemd
// passes it (socket activation) and what it tells systemd back (sd_notify: READY=1, STATUS=,
// WATCHDOG=1, STOPPING=1, EXTEND_TIMEOUT_USEC=). It is the one importer of go-systemd's
// activation and daemon packages.
//
// Without LISTEN_FDS for this process and without NOTIFY_SOCKET everything here is a no-op,
// so the daemon runs the same by hand, in tests and under systemd.
package systemd

import (
	"errors"
	"fmt"
	"net"
	"os"
	"slices"

	"github.com/coreos/go-systemd/v22/activation"
	"golang.org/x/sys/unix"
)

// listenFdsStart is SD_LISTEN_FDS_START: the first descriptor systemd passes.
const listenFdsStart = 3

// Sockets are the listening sockets systemd passed this process, by FileDescriptorName=.
// It is used by one goroutine while the daemon starts.
type Sockets struct {
	byName map[string][]net.Listener
}

// TakeSockets takes the sockets systemd passed (LISTEN_PID naming this process, LISTEN_FDS,
// LISTEN_FDNAMES) and unsets those variables, so that no child inherits them. Without them it
// returns an empty Sockets. A passed descriptor that is not a listening stream socket is an
// error that names it (a unit with Accept=yes or a datagram socket); every socket taken so
// far is closed then.
func TakeSockets() (*Sockets, error) {
	s := &Sockets{byName: map[string][]net.Listener{}}
	var errs []error
	for i, f := range activation.Files(true) {
		l, err := listener(f)
		f.Close() // net.FileListener holds its own duplicate
		if err != nil {
			errs = append(errs, fmt.Errorf("socket %q (fd %d) passed by systemd: %w", f.Name(), listenFdsStart+i, err))
			continue
		}
		s.byName[f.Name()] = append(s.byName[f.Name()], l)
	}
	if len(errs) > 0 {
		s.Close()
		return nil, errors.Join(errs...)
	}
	return s, nil
}

// listener makes a net.Listener of f after checking that it is a listening stream socket
// (net.FileListener alone would also take a datagram socket or a connection).
func listener(f *os.File) (net.Listener, error) {
	raw, err := f.SyscallConn()
	if err != nil {
		return nil, err
	}
	var typ, accepting int
	var serr error
	if err := raw.Control(func(fd uintptr) {
		if typ, serr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_TYPE); serr != nil {
			return
		}
		accepting, serr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_ACCEPTCONN)
	}); err != nil {
		return nil, err
	}
	switch {
	case serr != nil:
		return nil, fmt.Errorf("not a socket: %w", serr)
	case typ != unix.SOCK_STREAM:
		return nil, errors.New("not a stream socket (want ListenStream=)")
	case accepting != 1:
		return nil, errors.New("not a listening socket (want Accept=no)")
	}
	return net.FileListener(f)
}

// Activated reports whether systemd passed any socket still held.
func (s *Sockets) Activated() bool { return len(s.byName) > 0 }

// Take removes and returns the sockets named name; nil if there were none.
func (s *Sockets) Take(name string) []net.Listener {
	l := s.byName[name]
	delete(s.byName, name)
	return l
}

// Names lists the names of the sockets still held, sorted. A descriptor without a name is
// called LISTEN_FD_<n>.
func (s *Sockets) Names() []string {
	names := make([]string, 0, len(s.byName))
	for n := range s.byName {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Close closes the sockets still held. systemd keeps its own copies: closing them here
// neither unlinks nor stops listening on them.
func (s *Sockets) Close() error {
	var errs []error
	for name, ls := range s.byName {
		for _, l := range ls {
			if err := l.Close(); err != nil {
				errs = append(errs, fmt.Errorf("close socket %q: %w", name, err))
			}
		}
		delete(s.byName, name)
	}
	return errors.Join(errs...)
}
