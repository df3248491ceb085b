package discord

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"time"
)

// Discord restricts an IP that makes too many invalid requests: 10,000
// answered 401, 403 or 429 in 10 minutes (a 429 with X-RateLimit-Scope:
// shared does not count). The budget counts them in a sliding window of
// one-minute slots and stops REST calls before the limit is reached:
// non-essential ones (the deafness probe, gap backfill, thread joins and
// their read-back) at the soft mark, every call at the hard mark, so that
// klbr-discord never gets the host banned.

// Invalid-request budget defaults.
const (
	InvalidRequestLimit  = 10000
	invalidWindow        = 10 * time.Minute
	invalidSlots         = 10
	invalidSoftPercent   = 50 // non-essential calls stop here
	invalidHardPercent   = 90 // every call stops here
	invalidSlotDuration  = invalidWindow / invalidSlots
	nonEssentialCtxValue = ctxKey(1)
)

type ctxKey int

// ErrInvalidBudget is a REST call klbr-discord did not make: too many of
// its requests were answered 401, 403 or 429 in the last 10 minutes.
var ErrInvalidBudget = errors.New("discord: not sent: too many requests were refused (401/403/429) in the last 10 minutes; Discord bans an IP past 10,000; check the bot's token and permissions")

type invalidBudget struct {
	limit int
	now   func() time.Time

	mu    sync.Mutex
	slots [invalidSlots]struct {
		start time.Time
		n     int
	}
}

func newInvalidBudget(limit int) *invalidBudget {
	if limit <= 0 {
		limit = InvalidRequestLimit
	}
	return &invalidBudget{limit: limit, now: time.Now}
}

// countLocked is the invalid answers within the window.
func (b *invalidBudget) countLocked(now time.Time) int {
	n := 0
	for _, s := range b.slots {
		if now.Sub(s.start) < invalidWindow {
			n += s.n
		}
	}
	return n
}

// record counts an answer's status if it is invalid.
func (b *invalidBudget) record(resp *http.Response) {
	st := resp.StatusCode
	if st != 401 && st != 403 && st != 429 || st == 429 && resp.Header.Get("X-RateLimit-Scope") == "shared" {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.now()
	start := now.Truncate(invalidSlotDuration)
	s := &b.slots[(start.UnixNano()/int64(invalidSlotDuration))%invalidSlots]
	if !s.start.Equal(start) {
		s.start, s.n = start, 0
	}
	s.n++
}

// allow reports whether a call may be made now.
func (b *invalidBudget) allow(essential bool) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := b.countLocked(b.now())
	if essential {
		return n < b.limit*invalidHardPercent/100
	}
	return n < b.limit*invalidSoftPercent/100
}

// count is the invalid answers in the window.
func (b *invalidBudget) count() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.countLocked(b.now())
}

// nonEssential marks a REST call's context as one the budget stops first.
func nonEssential(ctx context.Context) context.Context {
	return context.WithValue(ctx, nonEssentialCtxValue, true)
}

func isNonEssential(ctx context.Context) bool {
	v, _ := ctx.Value(nonEssentialCtxValue).(bool)
	return v
}
