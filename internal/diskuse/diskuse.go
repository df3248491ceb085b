// Package diskuse keeps the data directory's usage against its bound
// ([storage] max_bytes): a measurement of the directory refreshed from time
// to time, plus what artifacts added since, plus what spools hold now. An
// artifact write asks it for room first; the database is never refused
// (inputs keep being admitted at the bound).
package diskuse

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/klbr-dev/klbr/internal/store"
)

// ErrFull is the refusal of an artifact write at the bound. Its text is
// what a cell and the operator see.
var ErrFull = errors.New("the data directory is at its bound ([storage] max_bytes)")

// FullError says how large the refused write was and how much room is left.
type FullError struct {
	Want, Used, Max int64
}

func (e *FullError) Error() string {
	return fmt.Sprintf("storage: %v: %d bytes in use of %d, so %d more bytes of this artifact are refused; "+
		"inputs are still admitted. Run `klbr-core gc` (under [retention]), raise max_bytes, or write less output",
		ErrFull, e.Used, e.Max, e.Want)
}

func (e *FullError) Unwrap() error { return ErrFull }

// Usage is the data directory's usage against its bound.
type Usage struct {
	Used     int64   `json:"used_bytes"`
	Max      int64   `json:"max_bytes"` // 0: unbounded
	WarnAt   float64 `json:"warn_at"`
	Headroom int64   `json:"headroom_bytes"` // Max - Used, at least 0; 0 when unbounded
	Warn     bool    `json:"warn"`           // Used is past WarnAt of Max
}

// Meter counts the data directory's bytes. Its methods are safe for
// concurrent use; Reserve and Release are a few atomic operations.
type Meter struct {
	dir    string
	max    int64
	warnAt float64

	base     atomic.Int64 // the last measurement
	added    atomic.Int64 // artifacts committed since it
	inflight atomic.Int64 // bytes in open spools

	refreshMu sync.Mutex    // one measurement at a time
	crossed   chan struct{} // buffered(1): usage passed warn_at or a write was refused
}

// New returns a meter of dir bounded by max bytes (0: unbounded) that
// warns past warnAt of it, measured once.
func New(dir string, max int64, warnAt float64) *Meter {
	m := &Meter{dir: dir, max: max, warnAt: warnAt, crossed: make(chan struct{}, 1)}
	m.Refresh()
	return m
}

// Refresh measures the directory again. Artifacts committed while it
// measures may be counted twice until the next one (never not at all).
func (m *Meter) Refresh() Usage {
	m.refreshMu.Lock()
	defer m.refreshMu.Unlock()
	before := m.added.Load()
	sz := store.DirSizes(m.dir)
	// Spool files under artifacts/tmp are counted by inflight, not here.
	tmp := store.TreeSize(m.dir + "/artifacts/tmp")
	m.base.Store(sz.Database + sz.WAL + sz.Artifacts - tmp + sz.Releases)
	m.added.Add(-before)
	return m.Usage()
}

// Usage is the usage now, without measuring.
func (m *Meter) Usage() Usage {
	used := m.base.Load() + m.added.Load() + m.inflight.Load()
	u := Usage{Used: used, Max: m.max, WarnAt: m.warnAt}
	if m.max > 0 {
		u.Headroom = max(0, m.max-used)
		u.Warn = float64(used) >= m.warnAt*float64(m.max)
	}
	return u
}

// Reserve asks for n more bytes of an artifact being spooled. At the bound
// it refuses with a *FullError and reserves nothing.
func (m *Meter) Reserve(n int64) error {
	if m == nil || m.max == 0 {
		if m != nil {
			m.inflight.Add(n)
		}
		return nil
	}
	in := m.inflight.Add(n)
	used := m.base.Load() + m.added.Load() + in
	if used > m.max {
		m.inflight.Add(-n)
		m.poke()
		return &FullError{Want: n, Used: used - n, Max: m.max}
	}
	if float64(used) >= m.warnAt*float64(m.max) && float64(used-n) < m.warnAt*float64(m.max) {
		m.poke()
	}
	return nil
}

// Crossed is signalled when a write passes warn_at or is refused.
func (m *Meter) Crossed() <-chan struct{} { return m.crossed }

func (m *Meter) poke() {
	select {
	case m.crossed <- struct{}{}:
	default:
	}
}

// Release gives back n reserved bytes of a spool that was dropped.
func (m *Meter) Release(n int64) {
	if m != nil {
		m.inflight.Add(-n)
	}
}

// Committed turns n reserved bytes into a stored artifact.
func (m *Meter) Committed(n int64) {
	if m != nil {
		m.inflight.Add(-n)
		m.added.Add(n)
	}
}

// Removed counts n bytes garbage collection freed.
func (m *Meter) Removed(n int64) {
	if m != nil {
		m.added.Add(-n)
	}
}
