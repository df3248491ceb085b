package hosts

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"strconv"
	"strings"
)

// File is a regular file in a unit's directory on its host.
type File struct {
	Path string // slash path relative to the unit's directory
	Size int64
}

// MaxListed bounds the entries ListFiles reads of a unit's directory.
const MaxListed = 10_000

// maxListBytes bounds a listing's bytes: a longer one is cut, and refused.
const maxListBytes = 4 << 20

// quiesce is the shell that makes sure nothing of unit $u runs any more
// before its directory is read: whatever the job left behind in its control
// group is killed (the unit stays loaded: its outcome is still to be read),
// and the group (cgroup v2, or v1's systemd hierarchy) is waited on until
// it is empty. Nothing can then change the
// directory under the reader.
const quiesce = `systemctl kill --signal=SIGKILL -- "$u" >/dev/null 2>&1
cg=$(systemctl show --property=ControlGroup --value -- "$u" 2>/dev/null)
p=
if [ -n "$cg" ]; then
  for x in "/sys/fs/cgroup$cg" "/sys/fs/cgroup/systemd$cg" "/sys/fs/cgroup/unified$cg"; do
    if [ -f "$x/cgroup.procs" ]; then p="$x/cgroup.procs"; break; fi
  done
fi
i=0
while [ -n "$p" ] && [ -s "$p" ] && [ $i -lt 100 ]; do sleep 0.05; i=$((i+1)); done
if [ -n "$p" ] && [ -s "$p" ]; then echo "processes of $u remain" >&2; exit 4; fi
`

// ListFiles lists the regular files in an ended unit's directory, without
// following a link (find -P), after killing whatever of the unit is left.
// The unit's own output file and its tmp/ are left out. At most MaxListed
// entries are read; more is an error.
func (e *Engine) ListFiles(ctx context.Context, host, unit string) ([]File, error) {
	c, err := e.conn(host)
	if err != nil {
		return nil, err
	}
	if err := CheckUnitName(unit); err != nil {
		return nil, err
	}
	script := fmt.Sprintf(`set -u
u=%s
d=%s
%scd -- "$d" 2>/dev/null || exit 0
find . -mindepth 1 \( -path ./tmp -o -path ./output \) -prune -o -type f -printf '%%s %%P\0' | head -z -n %d
`, Quote(unit), c.workDir(unit), quiesce, MaxListed+1)
	var out bytes.Buffer
	if err := c.run(ctx, script, &limited{w: &out, n: maxListBytes}); err != nil {
		return nil, err
	}
	return parseList(out.Bytes())
}

// parseList reads find's "SIZE PATH\0" records.
func parseList(b []byte) ([]File, error) {
	var out []File
	for len(b) > 0 {
		i := bytes.IndexByte(b, 0)
		if i < 0 {
			return nil, errors.New("hosts: a file listing cut short")
		}
		rec := string(b[:i])
		b = b[i+1:]
		sz, p, ok := strings.Cut(rec, " ")
		n, err := strconv.ParseInt(sz, 10, 64)
		if !ok || err != nil || n < 0 || !cleanRel(p) {
			return nil, fmt.Errorf("hosts: a malformed file listing entry %q", rec)
		}
		if len(out) == MaxListed {
			return nil, fmt.Errorf("hosts: more than %d files in the directory", MaxListed)
		}
		out = append(out, File{Path: p, Size: n})
	}
	return out, nil
}

// cleanRel says whether p is a clean relative slash path that stays where
// it is relative to ("a/b", never "", "/a", "../a", "a/../b", "a//b").
func cleanRel(p string) bool {
	return p != "" && len(p) <= 4096 && !path.IsAbs(p) && path.Clean(p) == p && p != ".." &&
		!strings.HasPrefix(p, "../") && !strings.ContainsRune(p, 0)
}

// FetchFiles copies the named regular files of an ended unit's directory
// (paths as ListFiles gave them) from the host, each to fn with at most
// max bytes of it (fn must read what it is given before it returns). What
// the host sends is judged here too: an entry that is not a regular file of
// a name that was asked for ends the fetch with an error, and a file larger
// than max is cut at max (fn sees its whole size).
func (e *Engine) FetchFiles(ctx context.Context, host, unit string, names []string, max int64, fn func(name string, size int64, r io.Reader) error) error {
	c, err := e.conn(host)
	if err != nil {
		return err
	}
	if err := CheckUnitName(unit); err != nil {
		return err
	}
	if len(names) == 0 {
		return nil
	}
	want := make(map[string]bool, len(names))
	var list bytes.Buffer
	for _, n := range names {
		if !cleanRel(n) {
			return fmt.Errorf("hosts: %q is not a clean relative path", n)
		}
		want[n] = true
		list.WriteString(n)
		list.WriteByte(0)
	}
	// --no-recursion: a name that became a directory sends only itself;
	// tar does not follow a link at the end of a name (it sends the link,
	// refused below), and nothing of the job runs to swap one in on the
	// way (quiesce).
	script := fmt.Sprintf(`set -u
u=%s
d=%s
%scd -- "$d"
exec tar -c -f - --format=pax --null --no-recursion --verbatim-files-from -T -
`, Quote(unit), c.workDir(unit), quiesce)
	pr, pw := io.Pipe()
	runErr := make(chan error, 1)
	go func() {
		err := c.runIn(ctx, script, &list, pw)
		pw.CloseWithError(err)
		runErr <- err
	}()
	err = readFiles(pr, want, max, fn)
	if err == nil {
		// tar pads its end to a whole record: read what follows the
		// archive's end (a few KiB), so the host's tar exits well.
		_, _ = io.Copy(io.Discard, io.LimitReader(pr, 1<<20))
	}
	pr.CloseWithError(errors.New("hosts: fetch ended"))
	rerr := <-runErr
	if err != nil {
		return fmt.Errorf("host %s: outputs of %s: %w", host, unit, err)
	}
	var ee interface{ ExitCode() int }
	if rerr != nil && !(errors.As(rerr, &ee) && ee.ExitCode() == 1) { // 1: some file changed or vanished
		return fmt.Errorf("host %s: outputs of %s: %w", host, unit, rerr)
	}
	return nil
}

// readFiles reads a tar stream of the files in want, each to fn.
func readFiles(r io.Reader, want map[string]bool, max int64, fn func(string, int64, io.Reader) error) error {
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		name := strings.TrimPrefix(hdr.Name, "./")
		if !want[name] {
			return fmt.Errorf("the host sent %q, which was not asked for", hdr.Name)
		}
		delete(want, name)
		if hdr.Typeflag != tar.TypeReg {
			continue // no longer a regular file: left out
		}
		if hdr.Size < 0 {
			return fmt.Errorf("%q: a negative size", name)
		}
		if err := fn(name, hdr.Size, io.LimitReader(tr, max)); err != nil {
			return err
		}
	}
}
