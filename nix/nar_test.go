package nix_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// This file computes Nix's recursive ("NAR") hash of a directory tree without
// Nix: the hash buildGoModule's vendorHash and a flake.lock's narHash are.
//
// A NAR is a canonical serialization of a file tree. Every string is written
// as its length (uint64, little-endian) followed by its bytes, zero-padded to
// a multiple of 8. The tree is
//
//	"nix-archive-1" node
//	node      = "(" "type" ( regular | symlink | directory ) ")"
//	regular   = "regular" [ "executable" "" ] "contents" <bytes>
//	symlink   = "symlink" "target" <target>
//	directory = "directory" { "entry" "(" "name" <name> "node" node ")" }
//
// with directory entries sorted by name (bytewise). Only the owner-executable
// bit of a regular file is recorded; owners, times and other mode bits are not.
// The implementation is checked against nix-hash (TestNARHashMatchesNixHash)
// and against a public flake.lock narHash (TestNARHashOfPublicSource).

type narWriter struct {
	w   io.Writer
	err error
}

func (n *narWriter) str(s string) {
	n.bytes([]byte(s))
}

func (n *narWriter) bytes(b []byte) {
	if n.err != nil {
		return
	}
	var l [8]byte
	binary.LittleEndian.PutUint64(l[:], uint64(len(b)))
	if _, n.err = n.w.Write(l[:]); n.err != nil {
		return
	}
	if _, n.err = n.w.Write(b); n.err != nil {
		return
	}
	if pad := (8 - len(b)%8) % 8; pad > 0 {
		_, n.err = n.w.Write(make([]byte, pad))
	}
}

func (n *narWriter) node(path string) {
	if n.err != nil {
		return
	}
	fi, err := os.Lstat(path)
	if err != nil {
		n.err = err
		return
	}
	n.str("(")
	n.str("type")
	switch {
	case fi.Mode().IsRegular():
		n.str("regular")
		if fi.Mode().Perm()&0o100 != 0 {
			n.str("executable")
			n.str("")
		}
		n.str("contents")
		data, err := os.ReadFile(path)
		if err != nil {
			n.err = err
			return
		}
		n.bytes(data)
	case fi.Mode()&fs.ModeSymlink != 0:
		target, err := os.Readlink(path)
		if err != nil {
			n.err = err
			return
		}
		n.str("symlink")
		n.str("target")
		n.str(target)
	case fi.IsDir():
		n.str("directory")
		entries, err := os.ReadDir(path)
		if err != nil {
			n.err = err
			return
		}
		names := make([]string, 0, len(entries))
		for _, e := range entries {
			names = append(names, e.Name())
		}
		slices.Sort(names) // Go string order is bytewise, as Nix's.
		for _, name := range names {
			n.str("entry")
			n.str("(")
			n.str("name")
			n.str(name)
			n.str("node")
			n.node(filepath.Join(path, name))
			n.str(")")
		}
	default:
		n.err = fmt.Errorf("nar: %s: unsupported file type %v", path, fi.Mode().Type())
		return
	}
	n.str(")")
}

// narSHA256 is the SHA-256 of the NAR serialization of path.
func narSHA256(path string) ([]byte, error) {
	h := sha256.New()
	n := &narWriter{w: h}
	n.str("nix-archive-1")
	n.node(path)
	if n.err != nil {
		return nil, n.err
	}
	return h.Sum(nil), nil
}

// narHashSRI is the hash in the SRI form Nix writes: "sha256-<base64>".
func narHashSRI(path string) (string, error) {
	sum, err := narSHA256(path)
	if err != nil {
		return "", err
	}
	return "sha256-" + base64.StdEncoding.EncodeToString(sum), nil
}

// writeTree makes a small tree with every node type NAR knows, names that
// sort differently bytewise than case-insensitively, padding edge cases
// (lengths 0, 7, 8, 9) and a nested directory.
func writeTree(t *testing.T, root string) {
	t.Helper()
	files := []struct {
		name string
		data string
		mode os.FileMode
	}{
		{"a.txt", "hello\n", 0o644},
		{"B.txt", "", 0o644},
		{"run.sh", "#!/bin/sh\necho hi\n", 0o755},
		{"sub/seven77", "1234567", 0o644},
		{"sub/eight888", "12345678", 0o600},
		{"sub/deeper/nine99999", "123456789", 0o755},
		{"sub/deeper/.hidden", "x", 0o644},
	}
	for _, f := range files {
		p := filepath.Join(root, f.name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(f.data), f.mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, f.mode); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("../a.txt", filepath.Join(root, "sub", "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(root, "empty"), 0o755); err != nil {
		t.Fatal(err)
	}
}

// TestNARSerializationKnownBytes pins the serialization of a one-file tree
// byte for byte, so the format itself is checked where nix-hash is missing.
func TestNARSerializationKnownBytes(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	if err := os.WriteFile(p, []byte("abc"), 0o644); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	n := &narWriter{w: &buf}
	n.str("nix-archive-1")
	n.node(p)
	if n.err != nil {
		t.Fatal(n.err)
	}
	str := func(s string) string {
		var b strings.Builder
		var l [8]byte
		binary.LittleEndian.PutUint64(l[:], uint64(len(s)))
		b.Write(l[:])
		b.WriteString(s)
		b.WriteString(strings.Repeat("\x00", (8-len(s)%8)%8))
		return b.String()
	}
	want := str("nix-archive-1") + str("(") + str("type") + str("regular") + str("contents") + str("abc") + str(")")
	if got := buf.String(); got != want {
		t.Fatalf("NAR bytes:\n got %q\nwant %q", got, want)
	}
}

// TestNARHashMatchesNixHash compares the implementation with Nix's own
// nix-hash on a tree with files, executables, symlinks and empty directories.
func TestNARHashMatchesNixHash(t *testing.T) {
	nixHash := requireTool(t, "nix-hash", "nix-bin")
	root := filepath.Join(t.TempDir(), "tree")
	writeTree(t, root)
	for _, p := range []string{root, filepath.Join(root, "run.sh"), filepath.Join(root, "sub", "link"), filepath.Join(root, "empty")} {
		out, err := exec.Command(nixHash, "--type", "sha256", p).CombinedOutput()
		if err != nil {
			t.Fatalf("nix-hash %s: %v\n%s", p, err, out)
		}
		sum, err := narSHA256(p)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := hex.EncodeToString(sum), strings.TrimSpace(string(out)); got != want {
			t.Errorf("NAR sha256 of %s: got %s, nix-hash says %s", p, got, want)
		}
	}
}

// TestNARHashOfPublicSource checks the implementation against a narHash that
// Nix itself wrote into a public flake.lock. It needs that source tree, which
// is not part of this repository: set KLBR_NAR_FIXTURE=DIR=HASH, e.g. the
// nix-community/nixpkgs.lib tree at c185c7a5e5dd8f9add5b2f8ebeff00888b070742
// (unpacked with `git archive`) and the narHash hercules-ci/flake-parts locked
// for it, sha256-e+/T/pmEkLP6BHhYjx6GmwP5ivonQQn0bJdH9YrRB+Q=.
func TestNARHashOfPublicSource(t *testing.T) {
	spec := os.Getenv("KLBR_NAR_FIXTURE")
	if spec == "" {
		t.Skip("KLBR_NAR_FIXTURE=DIR=HASH not set: no public source tree to check the NAR hash against")
	}
	dir, want, ok := strings.Cut(spec, "=")
	if !ok {
		t.Fatalf("KLBR_NAR_FIXTURE=%q: want DIR=HASH", spec)
	}
	got, err := narHashSRI(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Fatalf("narHash of %s: got %s, the public lock says %s", dir, got, want)
	}
}
