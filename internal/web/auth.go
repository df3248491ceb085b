package web

import (
	"crypto/sha256"
	"crypto/subtle"
	"net"
	"net/http"
	"net/url"
	"strings"
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
	return subtle.ConstantTimeCompare(got[:], b.tokenSum[:]) == 1
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
// empty body. A valid ?token= on a GET sets the cookie and redirects to the
// same URL without it, as Jupyter does.
func (b *browser) guard(status int, next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		if q.Has("token") && r.Method == http.MethodGet && !isWebSocket(r) {
			if !b.tokenOK(q.Get("token")) {
				b.refuse(w, r, http.StatusUnauthorized, "wrong token in URL")
				return
			}
			http.SetCookie(w, &http.Cookie{
				Name: CookieName, Value: q.Get("token"), Path: "/",
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
			b.refuse(w, r, status, "missing or wrong operator token")
			return
		}
		next(w, r)
	}
}

// refuse answers with status and no content.
func (b *browser) refuse(w http.ResponseWriter, r *http.Request, status int, why string) {
	b.log.Warn("browser: refused", "path", r.URL.Path, "status", status, "why", why, "remote", r.RemoteAddr)
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Content-Length", "0")
	w.WriteHeader(status)
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
