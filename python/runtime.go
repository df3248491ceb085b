// Package python carries klbr's Python runtime (python/klbr-runtime/src)
// inside klbr-core and materializes it, content-addressed, under the data
// directory, so one binary is the whole install and the runtime's hash is
// part of the environment's fingerprint.
package python

import (
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"
)

//go:embed all:klbr-runtime/src
var embedded embed.FS

// Source is the embedded runtime, rooted at its src directory.
func Source() fs.FS {
	sub, err := fs.Sub(embedded, "klbr-runtime/src")
	if err != nil {
		panic(err) // the embed pattern guarantees the directory
	}
	return sub
}

// skip reports files that are build litter, not source.
func skip(p string, d fs.DirEntry) bool {
	base := path.Base(p)
	return base == "__pycache__" || strings.HasSuffix(base, ".pyc") || (strings.HasPrefix(base, ".") && p != ".")
}

// Hash is the content identity of a runtime tree: SHA-256 over every
// file's path and content, in path order.
func Hash(fsys fs.FS) (string, error) {
	var files []string
	err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if skip(p, d) {
			if d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		if d.Type().IsRegular() {
			files = append(files, p)
		} else if !d.IsDir() {
			return fmt.Errorf("runtime: %s is not a regular file", p)
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	sort.Strings(files)
	h := sha256.New()
	for _, p := range files {
		b, err := fs.ReadFile(fsys, p)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "%s\x00%d\x00", p, len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// Materialize writes the embedded runtime to <dir>/<hash>/src (read-only)
// unless it is there already, and returns that src directory and the hash.
func Materialize(dir string) (src, hash string, err error) {
	fsys := Source()
	if hash, err = Hash(fsys); err != nil {
		return "", "", err
	}
	final := filepath.Join(dir, hash)
	src = filepath.Join(final, "src")
	if _, err := os.Stat(src); err == nil {
		return src, hash, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", "", err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", "", err
	}
	tmp, err := os.MkdirTemp(dir, ".tmp-")
	if err != nil {
		return "", "", err
	}
	defer os.RemoveAll(tmp)
	if err := copyTree(fsys, filepath.Join(tmp, "src")); err != nil {
		return "", "", fmt.Errorf("materialize runtime: %w", err)
	}
	if err := os.Rename(tmp, final); err != nil {
		if _, serr := os.Stat(src); serr == nil {
			return src, hash, nil // another process won the race with the same content
		}
		return "", "", fmt.Errorf("materialize runtime: %w", err)
	}
	return src, hash, nil
}

func copyTree(fsys fs.FS, dst string) error {
	return fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if skip(p, d) {
			if d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		target := filepath.Join(dst, filepath.FromSlash(p))
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		b, err := fs.ReadFile(fsys, p)
		if err != nil {
			return err
		}
		f, err := os.OpenFile(target, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o444)
		if err != nil {
			return err
		}
		if _, err := f.Write(b); err != nil {
			f.Close()
			return err
		}
		if err := f.Sync(); err != nil {
			f.Close()
			return err
		}
		return f.Close()
	})
}

// Compile byte-compiles a materialized runtime for interpreter py, once, so
// that workers (which run with PYTHONDONTWRITEBYTECODE) do not recompile it
// at every start. A failure only costs start-up time, so it is returned for
// logging, not acted on.
func Compile(ctx context.Context, src, py string) error {
	marker := filepath.Join(src, "klbr_runtime", "__pycache__")
	if _, err := os.Stat(marker); err == nil {
		return nil
	}
	out, err := exec.CommandContext(ctx, py, "-s", "-m", "compileall", "-q", "-j", "0", src).CombinedOutput()
	if err != nil {
		return fmt.Errorf("compileall %s: %v: %s", src, err, out)
	}
	return nil
}
