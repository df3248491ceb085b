package hosts

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
)

// MaxTreeBytes bounds a tree sent to a host (the runtime, a behavior release).
const MaxTreeBytes = 256 << 20

// Tree is a directory tree packed as a tar archive, named by the SHA-256 of
// the archive's bytes: the same files give the same bytes, hence the same name.
type Tree struct {
	Hash string // hex SHA-256 of Tar
	Tar  []byte
}

// PackTree packs the regular files and directories under dir, in lexical
// order, with their permission bits only (no owners, no times), so that the
// same content always packs to the same Tree. Python's byte-code caches are
// left out; a symbolic link or any other kind of file is refused.
func PackTree(dir string) (Tree, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil || rel == "." {
			return err
		}
		if d.Name() == "__pycache__" && d.IsDir() {
			return filepath.SkipDir
		}
		if strings.HasSuffix(d.Name(), ".pyc") {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		hdr := &tar.Header{Name: filepath.ToSlash(rel), Mode: int64(info.Mode().Perm()), Format: tar.FormatPAX}
		switch {
		case d.IsDir():
			hdr.Typeflag, hdr.Name = tar.TypeDir, hdr.Name+"/"
			return tw.WriteHeader(hdr)
		case info.Mode().IsRegular():
			if buf.Len()+int(info.Size()) > MaxTreeBytes {
				return fmt.Errorf("over %d bytes", MaxTreeBytes)
			}
			hdr.Typeflag, hdr.Size = tar.TypeReg, info.Size()
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
			f, err := os.Open(path)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = io.CopyN(tw, f, info.Size())
			return err
		}
		return fmt.Errorf("%s: not a regular file or directory", rel)
	})
	if err == nil {
		err = tw.Close()
	}
	if err != nil {
		return Tree{}, fmt.Errorf("hosts: pack %s: %w", dir, err)
	}
	sum := sha256.Sum256(buf.Bytes())
	return Tree{Hash: hex.EncodeToString(sum[:]), Tar: buf.Bytes()}, nil
}

// PackFile packs one regular file as a tree holding it under its base name.
func PackFile(path string) (Tree, error) {
	dir, err := os.MkdirTemp("", "klbr-packfile-")
	if err != nil {
		return Tree{}, fmt.Errorf("hosts: pack %s: %w", path, err)
	}
	defer os.RemoveAll(dir)
	b, err := os.ReadFile(path)
	if err != nil {
		return Tree{}, fmt.Errorf("hosts: pack %s: %w", path, err)
	}
	if len(b) > MaxTreeBytes {
		return Tree{}, fmt.Errorf("hosts: pack %s: over %d bytes", path, MaxTreeBytes)
	}
	if err := os.WriteFile(filepath.Join(dir, filepath.Base(path)), b, 0o644); err != nil {
		return Tree{}, fmt.Errorf("hosts: pack %s: %w", path, err)
	}
	return PackTree(dir)
}

var treeHash = regexp.MustCompile(`^[0-9a-f]{64}$`)

// cacheDir is the shell expression of the host's tree cache.
func (c *conn) cacheDir() string {
	return c.workRoot() + "/cache"
}

// PutTree makes tree present on host, unpacked in WORK_DIR/cache/<hash>,
// and returns that directory and how many bytes went over the connection
// for it: the archive is sent only when the host does not hold the hash
// yet, and the host checks the archive's SHA-256 before it unpacks it into
// a fresh directory and renames that into place, so the cache never holds a
// partial or altered tree under a hash.
func (e *Engine) PutTree(ctx context.Context, host string, t Tree) (dir string, sent int64, err error) {
	c, err := e.conn(host)
	if err != nil {
		return "", 0, err
	}
	if !treeHash.MatchString(t.Hash) {
		return "", 0, fmt.Errorf("hosts: %q is not a tree hash", t.Hash)
	}
	head := fmt.Sprintf("set -eu\nc=%s\nd=\"$c/%s\"\n", c.cacheDir(), t.Hash)
	var out bytes.Buffer
	if err := c.run(ctx, head+`if [ -d "$d" ]; then echo "present $d"; else echo absent; fi`+"\n", &limited{w: &out, n: 8192}); err != nil {
		return "", 0, err
	}
	if p, ok := strings.CutPrefix(strings.TrimSpace(out.String()), "present "); ok {
		return p, 0, nil
	}
	script := head + fmt.Sprintf(`mkdir -p -- "$c" && chmod 700 -- "$c"
t=$(mktemp -d -- "$c/.in-XXXXXXXX")
trap 'rm -rf -- "$t"' EXIT
cat > "$t/tree.tar"
if ! echo "%s  $t/tree.tar" | sha256sum -c --status -; then echo "the tree's SHA-256 is not %s" >&2; exit 3; fi
mkdir -- "$t/tree"
tar -x --no-same-owner --no-same-permissions -f "$t/tree.tar" -C "$t/tree"
mv -T -- "$t/tree" "$d" 2>/dev/null || [ -d "$d" ]
echo "present $d"
`, t.Hash, t.Hash)
	out.Reset()
	cr := &countingReader{r: bytes.NewReader(t.Tar)}
	err = c.runIn(ctx, script, cr, &limited{w: &out, n: 8192})
	sent = cr.n.Load()
	if err != nil {
		return "", sent, fmt.Errorf("host %s: send tree %s: %w", host, t.Hash[:12], err)
	}
	p, ok := strings.CutPrefix(strings.TrimSpace(out.String()), "present ")
	if !ok {
		return "", sent, fmt.Errorf("host %s: send tree %s: unexpected answer %q", host, t.Hash[:12], out.String())
	}
	return p, sent, nil
}

type countingReader struct {
	r io.Reader
	n atomic.Int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}
