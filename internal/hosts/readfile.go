package hosts

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/klbr-dev/klbr/internal/kernel"
)

// FileRefusal is the host's klbr-kernel refusing to read a file of a cell's directory:
// a link on the way, a name outside the directory, not a regular file, other hard
// links, no such file, or (TooLarge) more bytes than asked for.
type FileRefusal struct {
	TooLarge bool
	Reason   string // the kernel's one line, cut to 300 bytes
}

func (e *FileRefusal) Error() string { return e.Reason }

// ReadBeneath writes the file name beneath WORK_DIR/dir on host to w: dir is a unit's
// directory (klbr-…service) or a workspace (klbr-ws-…), which the cells working there
// may write. The host's klbr-kernel reads it (--read-beneath), as the login, with no link
// followed at any component and nothing outside the directory reached; name is relative
// to the directory or absolute on the host (as a cell there names it). At most max bytes
// reach w; a refusal is a *FileRefusal and nothing was written.
func (e *Engine) ReadBeneath(ctx context.Context, host, kernelPath, dir, name string, max int64, w io.Writer) error {
	c, err := e.conn(host)
	if err != nil {
		return err
	}
	if CheckUnitName(dir) != nil && CheckWorkspaceName(dir) != nil {
		return fmt.Errorf("hosts: %q is neither a unit's directory nor a workspace", dir)
	}
	if name == "" || len(name) > kernel.MaxReadBeneathName || !utf8.ValidString(name) || strings.ContainsRune(name, 0) {
		return &FileRefusal{Reason: fmt.Sprintf("a path is 1 to %d bytes of UTF-8", kernel.MaxReadBeneathName)}
	}
	if max < 0 {
		max = 0
	}
	if kernelPath == "" {
		kernelPath = "klbr-kernel"
	}
	script := fmt.Sprintf(`p=$(command -v -- %s) || { echo "klbr: %s is not on the PATH of $(id -un) on the host" >&2; exit 127; }
exec "$p" %s %s/%s %s %d
`, Quote(kernelPath), Quote(kernelPath), kernel.ReadBeneathArg, c.workRoot(), Quote(dir), Quote(name), max)
	err = c.run(ctx, script, &limited{w: w, n: int(min(max, 1<<40))})
	var se *scriptError
	var ee *exec.ExitError
	if !errors.As(err, &se) || !errors.As(err, &ee) {
		return err
	}
	reason := se.last
	if len(reason) > 300 {
		reason = reason[:300]
	}
	reason = strings.ToValidUTF8(reason, "?")
	switch ee.ExitCode() {
	case kernel.ExitReadRefused:
		return &FileRefusal{Reason: reason}
	case kernel.ExitReadTooLarge:
		return &FileRefusal{TooLarge: true, Reason: reason}
	case kernel.ExitKernel:
		if strings.Contains(reason, "usage") || strings.Contains(reason, "flag provided but not defined") {
			return fmt.Errorf("host %s: its klbr-kernel cannot read a cell's files (%s): install this release's klbr-kernel there (klbr-core hosts shows the host's protocol)", host, reason)
		}
	}
	return fmt.Errorf("host %s: read %s in %s (exit %s): %w", host, strconv.Quote(name), dir, strconv.Itoa(ee.ExitCode()), err)
}
