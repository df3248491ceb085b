// Package secretfile reads a credential from a file the operator names
// (a route's api_key_file, discord.token_file, a systemd credential).
//
// The file is opened without blocking and must be a regular file: a FIFO
// or a device named by mistake would otherwise hang the reader at start
// (open(2) on a FIFO waits for a writer) or feed it without end. The read
// is bounded.
package secretfile

import (
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
)

// ErrNotRegular reports a path that is not a regular file.
var ErrNotRegular = errors.New("not a regular file")

// ErrTooLarge reports a file larger than the bound the caller gave.
var ErrTooLarge = errors.New("larger than a credential can be")

// Read returns the contents of the regular file at path, at most max bytes.
// Errors name what is wrong with the file, never its contents.
func Read(path string, max int64) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%w (%s)", ErrNotRegular, st.Mode().Type())
	}
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("%w (over %d bytes)", ErrTooLarge, max)
	}
	return b, nil
}
