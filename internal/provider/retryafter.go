package provider

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

// maxRetryAfter bounds what a route's Retry-After can ask for; the caller
// caps it again at its own backoff limit.
const maxRetryAfter = 24 * time.Hour

// parseRetryAfter reads a Retry-After header (RFC 9110 §10.2.3): a number of
// seconds, or an HTTP date, relative to now. Anything else, a date in the
// past or a negative number is 0 (no hint).
func parseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" || len(v) > 64 {
		return 0
	}
	var d time.Duration
	if s, err := strconv.ParseInt(v, 10, 64); err == nil {
		if s <= 0 {
			return 0
		}
		if s > int64(maxRetryAfter/time.Second) {
			return maxRetryAfter
		}
		d = time.Duration(s) * time.Second
	} else if t, err := http.ParseTime(v); err == nil {
		d = t.Sub(now)
	}
	return min(max(d, 0), maxRetryAfter)
}
