package diskuse

import (
	"errors"
	"testing"
)

func TestReserveAtTheBound(t *testing.T) {
	m := New(t.TempDir(), 1000, 0.5)
	if err := m.Reserve(400); err != nil {
		t.Fatal(err)
	}
	if err := m.Reserve(200); err != nil {
		t.Fatal(err)
	}
	select {
	case <-m.Crossed():
	default:
		t.Fatal("passing warn_at did not signal")
	}
	if err := m.Reserve(401); !errors.Is(err, ErrFull) {
		t.Fatalf("past the bound: %v", err)
	}
	m.Committed(600)
	m.Removed(600)
	if u := m.Usage(); u.Used != 0 || u.Headroom != 1000 || u.Warn {
		t.Fatalf("usage %+v", u)
	}
}

// BenchmarkReserve is the accounting alone, per artifact write.
func BenchmarkReserve(b *testing.B) {
	m := New(b.TempDir(), 1<<40, 0.8)
	for b.Loop() {
		if err := m.Reserve(4096); err != nil {
			b.Fatal(err)
		}
		m.Release(4096)
	}
}
