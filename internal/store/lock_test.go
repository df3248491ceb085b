package store

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// setOwnerPID rewrites the owner row of a closed store.
func setOwnerPID(t *testing.T, dir string, pid int) {
	t.Helper()
	registerDrivers()
	db, err := sql.Open(driverWrite, dsn(filepath.Join(dir, FileName)))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec("UPDATE owner SET pid = ? WHERE id = 1", pid); err != nil {
		t.Fatal(err)
	}
}

// A klbr-core SIGKILLed while it was starting a process leaves that child
// holding the lock's descriptor until its exec closes it: Open waits for
// it while the recorded owner is dead, and answers a living owner at once.
func TestOpenWaitsOutALockItsDeadOwnerLeft(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(context.Background(), dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	setOwnerPID(t, dir, dead.Process.Pid)

	held, err := lockDir(dir) // the child that has not exec'd yet
	if err != nil {
		t.Fatal(err)
	}
	go func(l *dirLock) { time.Sleep(300 * time.Millisecond); l.release() }(held)
	s, err = Open(context.Background(), dir, Options{})
	if err != nil {
		t.Fatalf("Open after the dead owner's lock was let go: %v", err)
	}
	s.Close()

	// A living owner: refused at once, naming it.
	setOwnerPID(t, dir, os.Getpid())
	living, err := lockDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer living.release()
	start := time.Now()
	_, err = Open(context.Background(), dir, Options{})
	if !errors.Is(err, ErrHeld) || time.Since(start) > 2*time.Second {
		t.Fatalf("Open of a store a living owner holds: %v after %s, want ErrHeld at once", err, time.Since(start))
	}
}
