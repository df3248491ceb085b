package uidtest

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestRunChild is what Run starts: it must find itself as Host, with no
// capability, unable to read a file of root's that root's tests can.
func TestRunChild(t *testing.T) {
	Child(t, "TestRun")
	if _, err := os.ReadFile(os.Getenv("UIDTEST_ROOTS_FILE")); !errors.Is(err, fs.ErrPermission) {
		t.Fatalf("reading root's 0600 file: %v, want permission denied", err)
	}
	if err := os.WriteFile(filepath.Join(os.Getenv(envDir), "mine"), nil, 0o600); err != nil {
		t.Fatalf("the child's own directory: %v", err)
	}
}

func TestRun(t *testing.T) {
	Root(t)
	secret := filepath.Join(Dir(t, 0, 0, 0o755), "root-only")
	if err := os.WriteFile(secret, []byte("root's"), 0o600); err != nil {
		t.Fatal(err)
	}
	Run(t, "TestRunChild", Host, Host, "UIDTEST_ROOTS_FILE="+secret)
}

// A thread acting on files as Cell makes what Cell owns and cannot read
// what Cell may not.
func TestAsFS(t *testing.T) {
	Root(t)
	dir := Dir(t, Cell, Cell, 0o755)
	secret := filepath.Join(Dir(t, 0, 0, 0o755), "root-only")
	os.WriteFile(secret, []byte("root's"), 0o600)
	errs := make(chan error, 2)
	go func() {
		if err := AsFS(Cell, Cell); err != nil {
			errs <- err
			errs <- nil
			return
		}
		errs <- os.Symlink(secret, filepath.Join(dir, "link"))
		_, err := os.ReadFile(secret)
		errs <- err
	}()
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	if err := <-errs; !errors.Is(err, fs.ErrPermission) {
		t.Fatalf("as Cell, reading root's 0600 file: %v, want permission denied", err)
	}
	st, err := os.Lstat(filepath.Join(dir, "link"))
	if err != nil {
		t.Fatal(err)
	}
	if uid := st.Sys().(*syscall.Stat_t).Uid; uid != Cell {
		t.Fatalf("the link belongs to uid %d, want %d", uid, Cell)
	}
	if b, err := os.ReadFile(secret); err != nil || string(b) != "root's" {
		t.Fatalf("this thread lost root's reach: %q %v", b, err)
	}
}
