package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	sqlite3 "github.com/mattn/go-sqlite3"
)

// ErrStorage wraps a write that failed because the storage did: the disk
// is full, an I/O error, a read-only file system. Nothing of the write was
// committed, so nothing it carried was acknowledged.
var ErrStorage = errors.New("storage failed")

// Fault is a storage fault in force: new work waits until a write succeeds again.
type Fault struct {
	Reason string    `json:"reason"`
	Since  time.Time `json:"since"`
	Last   time.Time `json:"last"` // the last failed write
}

// faults tracks the store's storage health.
type faults struct {
	mu      sync.Mutex // guards current
	current *Fault
	began   chan struct{} // buffered(1): a fault began
}

// storageReason reports whether err is a storage failure, and which.
func storageReason(err error) (string, bool) {
	var se sqlite3.Error
	if !errors.As(err, &se) {
		return "", false
	}
	switch se.Code {
	case sqlite3.ErrFull:
		return "the disk is full (SQLITE_FULL)", true
	case sqlite3.ErrIoErr:
		return fmt.Sprintf("an I/O error (SQLITE_IOERR, extended code %d)", int(se.ExtendedCode)), true
	case sqlite3.ErrReadonly:
		return "the database is read-only (SQLITE_READONLY): a read-only file system or permissions", true
	case sqlite3.ErrCantOpen:
		return "a database file cannot be opened (SQLITE_CANTOPEN)", true
	case sqlite3.ErrNomem:
		return "out of memory (SQLITE_NOMEM)", true
	}
	return "", false
}

// classify wraps a storage failure in ErrStorage with what to do, and
// notes the fault; other errors pass unchanged.
func (s *Store) classify(err error) error {
	if err == nil || errors.Is(err, ErrStorage) {
		return err
	}
	reason, ok := storageReason(err)
	if !ok {
		return err
	}
	now := s.clock()
	s.faults.mu.Lock()
	if s.faults.current == nil {
		s.faults.current = &Fault{Reason: reason, Since: now}
		s.log.Error("storage failed: new work waits until writes succeed again", "reason", reason, "error", err)
		select {
		case s.faults.began <- struct{}{}:
		default:
		}
	}
	s.faults.current.Last = now
	s.faults.mu.Unlock()
	return fmt.Errorf("%w: %s; nothing of this write was committed or acknowledged. Free space or fix the file system under %s: "+
		"klbr-core goes on by itself once writes succeed: %w", ErrStorage, reason, s.dir, err)
}

// recovered clears the fault after a successful commit.
func (s *Store) recovered() {
	s.faults.mu.Lock()
	f := s.faults.current
	s.faults.current = nil
	s.faults.mu.Unlock()
	if f != nil {
		s.log.Info("storage recovered: writes succeed again", "reason", f.Reason, "lasted", s.clock().Sub(f.Since))
	}
}

// FaultBegan is signalled when a storage fault begins.
func (s *Store) FaultBegan() <-chan struct{} { return s.faults.began }

// Fault returns the storage fault in force, or nil.
func (s *Store) Fault() *Fault {
	s.faults.mu.Lock()
	defer s.faults.mu.Unlock()
	if s.faults.current == nil {
		return nil
	}
	f := *s.faults.current
	return &f
}

// Probe writes and deletes 64 KB in one durable transaction, to learn
// whether writes of a real size succeed again (a one-row update could still
// fit in the write-ahead log's free space on a full disk); a success clears
// the fault.
func (s *Store) Probe(ctx context.Context) error {
	return s.Write(ctx, func(tx *Tx) error {
		if _, err := tx.exec(`INSERT INTO storage_probe (data) VALUES (zeroblob(65536))`); err != nil {
			return err
		}
		_, err := tx.exec(`DELETE FROM storage_probe`)
		return err
	})
}
