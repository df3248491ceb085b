package discord

import (
	"log/slog"
	"sync"
	"time"
)

// coreLink says once that klbr-core cannot be reached and once that it is
// back, however many calls fail meanwhile: each caller retries on its own
// (admission, claims, receipts), and a retry is no news.
type coreLink struct {
	log *slog.Logger
	now func() time.Time

	mu    sync.Mutex // guards down, since, fails
	down  bool
	since time.Time
	fails int
}

func newCoreLink(log *slog.Logger) *coreLink {
	return &coreLink{log: log, now: time.Now}
}

// failed records a call to klbr-core that failed and will be retried.
func (l *coreLink) failed(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.fails++
	if l.down {
		return
	}
	l.down, l.since = true, l.now()
	l.log.Warn("lost klbr-core: retrying until it is back; messages are kept and admitted in order then", "error", err)
}

// ok records a call to klbr-core that succeeded.
func (l *coreLink) ok() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.down {
		return
	}
	l.log.Info("klbr-core is back", "after", l.now().Sub(l.since).Round(time.Millisecond), "failed_calls", l.fails)
	l.down, l.fails = false, 0
}
