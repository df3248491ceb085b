package kernel

import (
	"fmt"
	"io"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// bridgeStdio makes the protocol socket of --protocol-stdio: it returns the child's end
// and copies, until either side ends, the kernel's stdin to the socket and the socket to
// the kernel's stdout. The end of stdin (the core went away) shuts the socket's write side,
// which the worker reads as the end of the stream and exits 0; the end of the socket (every
// copy of the child's end closed) closes stdout.
func (k *kernel) bridgeStdio() (*os.File, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("protocol socket: %w", err)
	}
	ours := os.NewFile(uintptr(fds[0]), "protocol-bridge")
	child := os.NewFile(uintptr(fds[1]), "protocol")
	go func() {
		_, _ = io.Copy(ours, os.Stdin)
		_ = unix.Shutdown(fds[0], unix.SHUT_WR)
	}()
	k.drained = make(chan struct{})
	go func() {
		_, _ = io.Copy(os.Stdout, ours)
		os.Stdout.Close()
		close(k.drained)
	}()
	return child, nil
}

// drain waits a little for the last frames of the child to reach stdout before the kernel
// exits.
func (k *kernel) drain() {
	if k.drained == nil {
		return
	}
	select {
	case <-k.drained:
	case <-time.After(time.Second):
	}
}
