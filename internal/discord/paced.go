package discord

import (
	"context"
	"io"
	"time"
)

// paced reads from r at most rate bytes a second (after a first burst of
// pacedBurst), in chunks of at most pacedChunk, sleeping between them until
// each chunk is due: the bytes of a fetch are copied, streamed and hashed
// a little at a time instead of in one stretch that takes the CPU from
// what arrives meanwhile. The schedule counts from the first read, so
// sleeps that run late do not slow the average.
type paced struct {
	ctx   context.Context
	r     io.Reader
	rate  int64 // bytes a second
	start time.Time
	n     int64       // bytes read so far
	timer *time.Timer // reused between chunks
}

const (
	pacedChunk = 32 << 10
	pacedBurst = 64 << 10
)

func newPaced(ctx context.Context, r io.Reader, rate int64) *paced {
	return &paced{ctx: ctx, r: r, rate: rate}
}

func (p *paced) Read(b []byte) (int, error) {
	if p.start.IsZero() {
		p.start = time.Now()
	}
	if len(b) > pacedChunk {
		b = b[:pacedChunk]
	}
	if ahead := p.n - pacedBurst; ahead > 0 {
		due := p.start.Add(time.Duration(float64(ahead) / float64(p.rate) * float64(time.Second)))
		if d := time.Until(due); d > 0 {
			if p.timer == nil {
				p.timer = time.NewTimer(d)
			} else {
				p.timer.Reset(d)
			}
			select {
			case <-p.timer.C:
			case <-p.ctx.Done():
				p.timer.Stop()
				return 0, p.ctx.Err()
			}
		}
	}
	n, err := p.r.Read(b)
	p.n += int64(n)
	return n, err
}
