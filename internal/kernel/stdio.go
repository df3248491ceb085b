package kernel

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// stdioOutFD is the child's descriptor for writing the protocol under --protocol-stdio
// (KLBR_PROTOCOL_OUT_FD); it reads the protocol from fd 3.
const stdioOutFD = 4

// stdioProtocol is what the child of --protocol-stdio gets as fds 3 and 4: the kernel's own
// stdin and stdout, the very pipes the core's SSH session handed it, so that nothing copies
// between them (a copy here was one more process to wake each way of every frame on a
// worker host).
func stdioProtocol() []*os.File {
	return []*os.File{os.Stdin, os.Stdout}
}

// releaseStdio points the kernel's own stdin and stdout at /dev/null once the child holds
// them: the core then reads the end of the stream as soon as the child (and anything it
// passed the descriptors to) is gone, as with --protocol-fd.
func releaseStdio() error {
	null, err := unix.Open(os.DevNull, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("protocol: open %s: %w", os.DevNull, err)
	}
	defer unix.Close(null)
	for _, fd := range []int{0, 1} {
		if err := unix.Dup3(null, fd, 0); err != nil {
			return fmt.Errorf("protocol: release fd %d: %w", fd, err)
		}
	}
	return nil
}
