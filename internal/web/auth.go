package web

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/klbr-dev/klbr/internal/httpguard"
)

// CookieName is the cookie that carries the operator token after the first
// load with ?token=.
const CookieName = "klbr_token"

// tokenOK compares a presented token with the operator token in constant
// time (over digests, so the length does not leak either).
func (b *browser) tokenOK(presented string) bool {
	if presented == "" {
		return false
	}
	got := sha256.Sum256([]byte(presented))
	b.tokenMu.RLock()
	want := b.tokenSum
	b.tokenMu.RUnlock()
	return subtle.ConstantTimeCompare(got[:], want[:]) == 1
}

// signedOut is closed when the token in force at the call is rotated.
func (b *browser) signedOut() <-chan struct{} {
	b.tokenMu.RLock()
	defer b.tokenMu.RUnlock()
	return b.rotated
}

// RotateToken makes token the operator token: every cookie and bearer token
// issued with the old one stops working at once, and every open socket is
// closed (1008, "signed out"). The caller has written token to the token
// file (setup.RotateToken) so that `klbr-core open` prints it.
func (s *Server) RotateToken(token string) error {
	b := s.browser
	if b == nil {
		return errors.New("web: the browser client is not serving")
	}
	if len(token) < 32 {
		return errors.New("web: the operator token is too short")
	}
	b.tokenMu.Lock()
	b.tokenSum = sha256.Sum256([]byte(token))
	old := b.rotated
	b.rotated = make(chan struct{})
	b.tokenMu.Unlock()
	close(old)
	b.log.Info("browser: the operator token was rotated; every browser is signed out")
	return nil
}

// presented is the token a request carries: the cookie, or an
// "Authorization: Bearer" header for non-browser clients.
func presented(r *http.Request) string {
	if c, err := r.Cookie(CookieName); err == nil && c.Value != "" {
		return c.Value
	}
	if v, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
		return strings.TrimSpace(v)
	}
	return ""
}

// guard admits requests that carry the token; others get status with an
// empty body (the page itself answers with how to get in, see handleLogin).
// A valid ?token= on a GET sets the cookie (for CookieMaxAge) and redirects
// to the same URL without it, as Jupyter does.
func (b *browser) guard(status int, next http.HandlerFunc) http.HandlerFunc {
	return b.guardPage(status, false, next)
}

// guardPage is guard; with login a request without the token gets the
// sign-in page instead of an empty answer.
func (b *browser) guardPage(status int, login bool, next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		if q.Has("token") && r.Method == http.MethodGet && !isWebSocket(r) {
			if !b.tokenOK(q.Get("token")) {
				if login {
					b.login(w, r)
					return
				}
				b.refuse(w, r, http.StatusUnauthorized, "wrong token in URL")
				return
			}
			if !b.trust(w, r) {
				return
			}
			http.SetCookie(w, &http.Cookie{
				Name: CookieName, Value: q.Get("token"), Path: "/",
				MaxAge:   int(b.cookieMaxAge() / time.Second),
				HttpOnly: true, SameSite: http.SameSiteStrictMode,
			})
			q.Del("token")
			// One leading slash: never a protocol-relative redirect.
			u := url.URL{Path: "/" + strings.TrimLeft(r.URL.Path, "/"), RawQuery: q.Encode()}
			w.Header().Set("Cache-Control", "no-store")
			http.Redirect(w, r, u.String(), http.StatusSeeOther)
			return
		}
		if !b.tokenOK(presented(r)) {
			if login {
				b.login(w, r)
				return
			}
			b.refuse(w, r, status, "missing or wrong operator token")
			return
		}
		if !b.trust(w, r) {
			return
		}
		next(w, r)
	}
}

// trust lets the connection of a request with the token keep its place past a
// stranger's (httpguard.Trust); when the operator's places are all taken it answers 503.
func (b *browser) trust(w http.ResponseWriter, r *http.Request) bool {
	if httpguard.Trust(w, r) {
		return true
	}
	b.logRefused(r, http.StatusServiceUnavailable, "every connection kept for the operator is open")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Retry-After", "1")
	http.Error(w, "klbr: every connection kept for the operator is open; close other klbr tabs or retry", http.StatusServiceUnavailable)
	return false
}

func (b *browser) cookieMaxAge() time.Duration {
	if b.CookieMaxAge > 0 {
		return b.CookieMaxAge
	}
	return DefaultCookieMaxAge
}

// DefaultCookieMaxAge is the login cookie's lifetime when Browser leaves it
// unset (klbr.toml's browser.cookie_days, 30 by default).
const DefaultCookieMaxAge = 30 * 24 * time.Hour

// loginPage is what GET / answers without a valid token: how to get in. It
// names no secret and loads nothing.
const loginPage = `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>klbr — sign in</title>
<style>body{font:16px/1.5 system-ui,sans-serif;max-width:36em;margin:12vh auto;padding:0 1em;color:#222;background:#fafafa}
code,pre{font:14px ui-monospace,monospace;background:#eee;padding:.1em .3em;border-radius:3px}pre{padding:.6em}
@media (prefers-color-scheme:dark){body{color:#ddd;background:#161616}code,pre{background:#2a2a2a}}</style></head>
<body><main><h1>klbr is running</h1>
<p id="login-help">This page needs the operator token. Run this on the machine klbr runs on, and open the URL it prints:</p>
<pre>klbr-core open</pre>
<p>The URL signs this browser in for %s (a cookie); the token leaves the address bar at once.
<code>klbr-core open --rotate</code> makes a new token and signs every browser out.</p>
</main></body></html>
`

// login answers a page request without a valid token: 401 with how to get in.
func (b *browser) login(w http.ResponseWriter, r *http.Request) {
	b.logRefused(r, http.StatusUnauthorized, "missing or wrong operator token (sent the sign-in page)")
	secureHeaders(w)
	w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; frame-ancestors 'none'")
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(http.StatusUnauthorized)
	fmt.Fprintf(w, loginPage, days(b.cookieMaxAge()))
}

func days(d time.Duration) string {
	n := int(d / (24 * time.Hour))
	if n == 1 {
		return "1 day"
	}
	if n < 1 {
		return d.String()
	}
	return fmt.Sprintf("%d days", n)
}

// refuse answers with status and no content.
func (b *browser) refuse(w http.ResponseWriter, r *http.Request, status int, why string) {
	b.logRefused(r, status, why)
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Content-Length", "0")
	w.WriteHeader(status)
}

// logRefused logs a refused request, at most once a second: anyone on the machine can
// send requests without the token as fast as the port answers, and the log must not be
// what they fill. A line says how many refusals were left out before it.
func (b *browser) logRefused(r *http.Request, status int, why string) {
	b.refusedMu.Lock()
	now := time.Now()
	if now.Before(b.refusedNext) {
		b.refusedSkipped++
		b.refusedMu.Unlock()
		return
	}
	skipped := b.refusedSkipped
	b.refusedNext, b.refusedSkipped = now.Add(time.Second), 0
	b.refusedMu.Unlock()
	b.log.Warn("browser: refused", "path", r.URL.Path, "status", status, "why", why, "remote", r.RemoteAddr, "refusals_not_logged", skipped)
}

func isWebSocket(r *http.Request) bool {
	return strings.EqualFold(r.Header.Get("Upgrade"), "websocket")
}

// originOK accepts a missing Origin (a non-browser client) or a loopback
// http(s) origin whose host:port is the one the request was sent to, so
// that another page on a loopback port cannot reach the socket either.
func originOK(r *http.Request) bool {
	o := r.Header.Get("Origin")
	if o == "" {
		return true
	}
	u, err := url.Parse(o)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.User != nil ||
		(u.Path != "" && u.Path != "/") || u.RawQuery != "" {
		return false
	}
	if !loopbackHost(u.Hostname()) || !loopbackHost(hostOnly(r.Host)) {
		return false
	}
	return strings.EqualFold(u.Host, r.Host)
}

func hostOnly(hostport string) string {
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		return h
	}
	return strings.Trim(hostport, "[]")
}

func loopbackHost(h string) bool {
	if strings.EqualFold(h, "localhost") {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}
