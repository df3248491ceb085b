package store

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// Owner is the process that holds a data directory.
type Owner struct {
	PID       int       `json:"pid"`
	Host      string    `json:"host"`
	StartedAt time.Time `json:"started_at"`
}

func (o Owner) String() string {
	return fmt.Sprintf("pid %d on %s since %s", o.PID, o.Host, o.StartedAt.UTC().Format(time.RFC3339))
}

// ErrHeld is the sentinel behind HeldError.
var ErrHeld = errors.New("data directory is held by another klbr-core")

// HeldError says which process holds the data directory, when that is known.
type HeldError struct {
	Dir   string
	Owner *Owner // nil when the holder has not yet written its owner row
}

func (e *HeldError) Error() string {
	if e.Owner == nil {
		return fmt.Sprintf("%s is held by another klbr-core (holder not yet recorded); stop it first or use another KLBR_DATA_DIR", e.Dir)
	}
	return fmt.Sprintf("%s is held by klbr-core %s; stop it first (klbr-core stop) or use another KLBR_DATA_DIR", e.Dir, e.Owner)
}

func (e *HeldError) Unwrap() error { return ErrHeld }

// dirLock is a cooperating exclusive flock on the data directory itself.
// The kernel drops it when the process dies, so a crash never leaves it stale.
type dirLock struct{ f *os.File }

func lockDir(dir string) (*dirLock, error) {
	f, err := os.OpenFile(dir, os.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open data directory: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, errLocked
		}
		return nil, fmt.Errorf("lock data directory: %w", err)
	}
	return &dirLock{f: f}, nil
}

var errLocked = errors.New("locked")

// deadOwnerWait bounds how long Open waits for a lock whose recorded owner
// is dead: a process that klbr-core was starting when it was killed holds
// the descriptor from its fork until its exec closes it (close-on-exec).
const deadOwnerWait = 5 * time.Second

// lockDirAfterDeadOwner takes the lock; while another holds it whose
// recorded owner on this host has died, it tries again for deadOwnerWait,
// since only a child that owner was starting can still hold it, and not
// for long. A living owner is answered errLocked at once.
func lockDirAfterDeadOwner(ctx context.Context, dir string) (*dirLock, error) {
	deadline := time.Now().Add(deadOwnerWait)
	for {
		lock, err := lockDir(dir)
		if !errors.Is(err, errLocked) || time.Now().After(deadline) || !ownerDead(ctx, dir) {
			return lock, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// ownerDead reports whether the owner the store records ran on this host
// and no process of its pid exists any more.
func ownerDead(ctx context.Context, dir string) bool {
	o := readOwner(ctx, dir)
	if o == nil || o.PID <= 0 {
		return false
	}
	if host, _ := os.Hostname(); host != o.Host {
		return false
	}
	return errors.Is(unix.Kill(o.PID, 0), unix.ESRCH)
}

func (l *dirLock) release() error {
	if l == nil || l.f == nil {
		return nil
	}
	err := l.f.Close() // closing the last descriptor drops the flock
	l.f = nil
	return err
}

func currentOwner(now time.Time) Owner {
	host, _ := os.Hostname()
	return Owner{PID: os.Getpid(), Host: host, StartedAt: now}
}
