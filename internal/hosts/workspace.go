package hosts

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"regexp"
	"strings"
)

// A workspace on a host is a directory WORK_DIR/<name> (name klbr-ws-…)
// made from a cached tree (PutTree): a child agent's copy of its parent's
// workspace. It outlives the worker generations that work in it (a unit's
// own directory goes with its unit) until RemoveWorkspace.
var workspaceName = regexp.MustCompile(`^klbr-ws-[a-z0-9][a-z0-9-]{0,100}$`)

// CheckWorkspaceName refuses a name that is not klbr-ws-… of plain characters.
func CheckWorkspaceName(name string) error {
	if !workspaceName.MatchString(name) {
		return fmt.Errorf("hosts: %q is not a workspace name (klbr-ws-[a-z0-9-]+)", name)
	}
	return nil
}

// MakeWorkspace makes WORK_DIR/name on host, a new directory holding a copy
// of the cached tree hash (put there by PutTree), and returns its path on
// the host. A name that exists already is refused: nothing is overwritten.
func (e *Engine) MakeWorkspace(ctx context.Context, host, name, hash string) (string, error) {
	c, err := e.conn(host)
	if err != nil {
		return "", err
	}
	if err := CheckWorkspaceName(name); err != nil {
		return "", err
	}
	if !treeHash.MatchString(hash) {
		return "", fmt.Errorf("hosts: %q is not a tree hash", hash)
	}
	script := fmt.Sprintf(`set -eu
r=%s
c="$r/cache/%s"
d="$r"/%s
[ -d "$c" ] || { echo "tree %s is not in the host's cache" >&2; exit 3; }
[ ! -e "$d" ] || { echo "$d exists already" >&2; exit 3; }
t=$(mktemp -d -- "$r/.ws-XXXXXXXX")
trap 'rm -rf -- "$t"' EXIT
cp -R -- "$c/." "$t/"
chmod -R u+rwX -- "$t"
chmod 700 -- "$t"
mv -T -- "$t" "$d"
trap - EXIT
echo "made $d"
`, c.workRoot(), hash, Quote(name), hash[:12])
	var out bytes.Buffer
	if err := c.run(ctx, script, &limited{w: &out, n: 8192}); err != nil {
		return "", fmt.Errorf("host %s: make workspace %s: %w", host, name, err)
	}
	dir, ok := strings.CutPrefix(strings.TrimSpace(out.String()), "made ")
	if !ok {
		return "", fmt.Errorf("host %s: make workspace %s: unexpected answer %q", host, name, out.String())
	}
	return dir, nil
}

// ReadWorkspace writes WORK_DIR/name on host to w as a tar archive (as the
// host's tar makes it; every .git left out). The archive is the host's
// word: its reader bounds and checks it. A w that fails ends the transfer.
func (e *Engine) ReadWorkspace(ctx context.Context, host, name string, w io.Writer) error {
	c, err := e.conn(host)
	if err != nil {
		return err
	}
	if err := CheckWorkspaceName(name); err != nil {
		return err
	}
	script := fmt.Sprintf(`set -eu
d=%s/%s
[ -d "$d" ] || { echo "the workspace $d is not on the host" >&2; exit 3; }
exec tar -c -f - -C "$d" --exclude=.git .
`, c.workRoot(), Quote(name))
	if err := c.run(ctx, script, w); err != nil {
		return fmt.Errorf("host %s: read workspace %s: %w", host, name, err)
	}
	return nil
}

// RemoveWorkspace removes WORK_DIR/name on host; one that is gone is no error.
func (e *Engine) RemoveWorkspace(ctx context.Context, host, name string) error {
	c, err := e.conn(host)
	if err != nil {
		return err
	}
	if err := CheckWorkspaceName(name); err != nil {
		return err
	}
	if err := c.run(ctx, "rm -rf -- "+c.workRoot()+"/"+Quote(name), io.Discard); err != nil {
		return fmt.Errorf("host %s: remove workspace %s: %w", host, name, err)
	}
	return nil
}
