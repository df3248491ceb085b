package store

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	sqlite3 "github.com/mattn/go-sqlite3"
)

// Storage failures are wrapped in ErrStorage with what to do and put the
// store in a fault until a commit succeeds; other errors pass unchanged.
func TestStorageFaults(t *testing.T) {
	s := newStore(t)
	for _, tc := range []struct {
		name    string
		err     error
		storage bool
		reason  string
	}{
		{"full", fmt.Errorf("store: commit: %w", sqlite3.Error{Code: sqlite3.ErrFull}), true, "disk is full"},
		{"io", sqlite3.Error{Code: sqlite3.ErrIoErr, ExtendedCode: sqlite3.ErrIoErrWrite}, true, "I/O error"},
		{"read-only", sqlite3.Error{Code: sqlite3.ErrReadonly}, true, "read-only"},
		{"constraint", sqlite3.Error{Code: sqlite3.ErrConstraint}, false, ""},
		{"plain", errors.New("no such session"), false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := s.classify(tc.err)
			if errors.Is(got, ErrStorage) != tc.storage {
				t.Fatalf("classify(%v) = %v", tc.err, got)
			}
			f := s.Fault()
			if !tc.storage {
				if f != nil || got != tc.err {
					t.Fatalf("a non-storage error made a fault %+v or changed: %v", f, got)
				}
				return
			}
			if f == nil || !strings.Contains(f.Reason, tc.reason) || !strings.Contains(got.Error(), "nothing of this write was committed") ||
				!errors.Is(got, tc.err) {
				t.Fatalf("fault %+v, error %v", f, got)
			}
			select {
			case <-s.FaultBegan():
			default:
				t.Fatal("the fault's beginning was not signalled")
			}
			if err := s.Probe(t.Context()); err != nil {
				t.Fatal(err)
			}
			if f := s.Fault(); f != nil {
				t.Fatalf("a successful write did not clear the fault: %+v", f)
			}
		})
	}
}
