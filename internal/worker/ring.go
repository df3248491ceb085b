package worker

import (
	"sync"
)

// ring keeps the last bytes written to it, for diagnostics. Writes never
// block and never fail, so a chatty worker cannot stall on its stderr.
type ring struct {
	mu   sync.Mutex // guards buf, full, pos
	buf  []byte
	full bool
	pos  int
}

func newRing(size int) *ring { return &ring{buf: make([]byte, size)} }

func (r *ring) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := len(p)
	if len(p) >= len(r.buf) {
		p = p[len(p)-len(r.buf):]
	}
	for len(p) > 0 {
		c := copy(r.buf[r.pos:], p)
		p = p[c:]
		r.pos += c
		if r.pos == len(r.buf) {
			r.pos, r.full = 0, true
		}
	}
	return n, nil
}

// String returns the kept tail.
func (r *ring) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.full {
		return string(r.buf[:r.pos])
	}
	return string(r.buf[r.pos:]) + string(r.buf[:r.pos])
}
