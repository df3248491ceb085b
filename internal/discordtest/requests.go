package discordtest

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// The REST side's bookkeeping: requests counted by route, answers injected
// on demand (401/403 for the invalid-request budget), and Discord's
// rate-limit bucket headers on message creation when BucketLimit is set.

type reqState struct {
	counts   map[string]int // "METHOD /path" (no query)
	onReq    func(*http.Request) int
	buckets  map[string]*bucket
	limit    int           // per bucket window; 0: no bucket headers
	window   time.Duration // the bucket's window
	limited  int           // 429s answered by the bucket
	invalids int           // 401, 403 and 429 answered
}

type bucket struct {
	reset time.Time
	used  int
}

// SetOnRequest makes fn decide each REST request first: a non-zero status
// answers it with that status and Discord's error body.
func (f *Fake) SetOnRequest(fn func(*http.Request) int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reqs.onReq = fn
}

// SetBucket makes message creation a rate-limit bucket per channel of
// limit requests per window, with Discord's X-RateLimit-* headers on each
// answer and 429 past it.
func (f *Fake) SetBucket(limit int, window time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reqs.limit, f.reqs.window = limit, window
}

// Requests counts the REST requests whose "METHOD /path" starts with prefix.
func (f *Fake) Requests(prefix string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for k, c := range f.reqs.counts {
		if strings.HasPrefix(k, prefix) {
			n += c
		}
	}
	return n
}

// Invalid counts the 401, 403 and 429 answers, and the 429s the bucket gave.
func (f *Fake) Invalid() (invalid, bucketLimited int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.reqs.invalids, f.reqs.limited
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (s *statusRecorder) WriteHeader(st int) {
	if s.status == 0 {
		s.status = st
	}
	s.ResponseWriter.WriteHeader(st)
}

func (s *statusRecorder) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = 200
	}
	return s.ResponseWriter.Write(b)
}

func (f *Fake) requests(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.URL.Path, "/api/") {
			next.ServeHTTP(w, r)
			return
		}
		f.mu.Lock()
		f.reqs.counts[r.Method+" "+r.URL.Path]++
		fn := f.reqs.onReq
		f.mu.Unlock()
		rec := &statusRecorder{ResponseWriter: w}
		defer func() {
			if rec.status == 401 || rec.status == 403 || rec.status == 429 {
				f.mu.Lock()
				f.reqs.invalids++
				f.mu.Unlock()
			}
		}()
		if fn != nil {
			if st := fn(r); st != 0 {
				switch st {
				case 401:
					jsonError(rec, st, 0, "401: Unauthorized")
				case 403:
					jsonError(rec, st, 50001, "Missing Access")
				default:
					jsonError(rec, st, 0, http.StatusText(st))
				}
				return
			}
		}
		if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/messages") && !f.takeBucket(rec, r.URL.Path) {
			return
		}
		next.ServeHTTP(rec, r)
	})
}

// takeBucket sets the bucket headers and reports whether the request may
// go on; past the limit it answers 429 as Discord does.
func (f *Fake) takeBucket(w http.ResponseWriter, path string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.reqs.limit <= 0 {
		return true
	}
	now := time.Now()
	b := f.reqs.buckets[path]
	if b == nil || !now.Before(b.reset) {
		b = &bucket{reset: now.Add(f.reqs.window)}
		f.reqs.buckets[path] = b
	}
	after := b.reset.Sub(now).Seconds()
	h := w.Header()
	h.Set("X-RateLimit-Limit", strconv.Itoa(f.reqs.limit))
	h.Set("X-RateLimit-Reset", strconv.FormatFloat(float64(b.reset.UnixMilli())/1000, 'f', 3, 64))
	h.Set("X-RateLimit-Reset-After", strconv.FormatFloat(after, 'f', 3, 64))
	h.Set("X-RateLimit-Bucket", "fake-"+strings.ReplaceAll(path, "/", "-"))
	if b.used >= f.reqs.limit {
		f.reqs.limited++
		h.Set("X-RateLimit-Remaining", "0")
		h.Set("X-RateLimit-Scope", "user")
		h.Set("Retry-After", strconv.Itoa(int(after)+1))
		h.Set("Content-Type", "application/json")
		w.WriteHeader(429)
		json.NewEncoder(w).Encode(map[string]any{"message": "You are being rate limited.", "retry_after": after, "global": false})
		return false
	}
	b.used++
	h.Set("X-RateLimit-Remaining", strconv.Itoa(f.reqs.limit-b.used))
	return true
}

func jsonError(w http.ResponseWriter, status, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]any{"message": msg, "code": code})
}

// SetDeaf makes the current gateway connection deaf (true): it goes on
// acknowledging heartbeats, and delivers no dispatch, nor keeps one for a
// resume to replay: the "connected, online, intermittently deaf" failure
// (Hermes #78881, #109521). A new connection (a resume or a new session)
// hears again. SetDeaf(false) heals the current one.
func (f *Fake) SetDeaf(on bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if on {
		f.deaf = f.cur
	} else {
		f.deaf = nil
	}
}
