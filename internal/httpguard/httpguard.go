// Package httpguard holds the limits every HTTP server of klbr runs with, so that no
// client, with or without a token, can starve a listener: header, body and idle timeouts,
// a bound on header bytes, and the Host check that keeps DNS-rebound pages away from the
// loopback UI.
package httpguard

import (
	"io"
	"net"
	"net/http"
	"strings"
	"time"
)

// Limits of one server. The zero value of a field means its default.
type Limits struct {
	Header time.Duration // to read the request line and headers; default 10 s
	Body   time.Duration // to read the request body once the headers are in; default 30 s
	Idle   time.Duration // a keep-alive connection between requests; default 60 s
	// MaxConns bounds the open connections of the listener (unixsock.LimitListener), or
	// behind a Gate its trusted connections; default 256.
	MaxConns int
	// Behind a Gate: how many connections that have not presented a credential may be
	// open (default DefaultStrangers), and how long each may live (default
	// DefaultStrangerLife).
	Strangers int
	Stranger  time.Duration
}

func (l Limits) header() time.Duration { return or(l.Header, 10*time.Second) }
func (l Limits) body() time.Duration   { return or(l.Body, 30*time.Second) }
func (l Limits) idle() time.Duration   { return or(l.Idle, 60*time.Second) }

// Conns is the connection bound in force.
func (l Limits) Conns() int {
	if l.MaxConns <= 0 {
		return 256
	}
	return l.MaxConns
}

func or(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}

// MaxHeaderBytes bounds the request line and headers of every server.
const MaxHeaderBytes = 64 << 10

// Apply sets the limits on srv and wraps its handler so that a request body must arrive
// within l.Body. There is no ReadTimeout or WriteTimeout: long answers (tail --follow,
// WebSocket, a waiting claim) are legitimate and are bounded by their own lag limits.
func Apply(srv *http.Server, l Limits) *http.Server {
	srv.ReadHeaderTimeout = l.header()
	srv.IdleTimeout = l.idle()
	srv.MaxHeaderBytes = MaxHeaderBytes
	srv.Handler = BodyDeadline(srv.Handler, l.body())
	return srv
}

// BodyDeadline gives a request d to deliver its body: the connection's read deadline is
// set when the handler starts and cleared once the body is read to its end, so a slow or
// stalled body is cut (the read fails, the handler answers an error and the connection
// closes) while a long answer after a complete request is not.
func BodyDeadline(next http.Handler, d time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
			next.ServeHTTP(w, r)
			return
		}
		if rc.SetReadDeadline(time.Now().Add(d)) == nil {
			r.Body = &deadlineBody{ReadCloser: r.Body, clear: func() { rc.SetReadDeadline(time.Time{}) }}
		}
		next.ServeHTTP(w, r)
	})
}

type deadlineBody struct {
	io.ReadCloser
	cleared bool
	clear   func()
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	// Only a complete body clears the deadline: after a failed read the server still
	// drains what is left before it answers, and that drain must not wait forever.
	if err == io.EOF && !b.cleared {
		b.cleared = true
		b.clear()
	}
	return n, err
}

// LoopbackHost reports whether a request's Host header names this machine's loopback: an
// IP literal in 127.0.0.0/8 or ::1, or "localhost" (any port). A page served from another
// name that resolves to 127.0.0.1 (DNS rebinding) carries that name and is refused.
func LoopbackHost(host string) bool {
	if host == "" {
		return false
	}
	h := host
	if hh, _, err := net.SplitHostPort(host); err == nil {
		h = hh
	}
	h = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")
	if strings.EqualFold(h, "localhost") || strings.EqualFold(h, "localhost.") {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// RequireLoopbackHost refuses, with 421 Misdirected Request, any request whose Host is not
// a loopback name.
func RequireLoopbackHost(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !LoopbackHost(r.Host) {
			http.Error(w, "klbr serves this machine's loopback only: the Host header must be 127.0.0.1, [::1] or localhost", http.StatusMisdirectedRequest)
			return
		}
		next.ServeHTTP(w, r)
	})
}
