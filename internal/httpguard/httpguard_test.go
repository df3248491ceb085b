package httpguard

import (
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestLoopbackHost(t *testing.T) {
	for host, want := range map[string]bool{
		"127.0.0.1:8765": true, "127.0.0.1": true, "127.3.4.5:1": true, "[::1]:8765": true, "::1": true,
		"localhost:8765": true, "LOCALHOST": true, "localhost.:80": true,
		"": false, "evil.example:8765": false, "localhost.evil.example": false, "10.0.0.1:8765": false,
		"[::ffff:10.0.0.1]:1": false, "0.0.0.0:8765": false, "127.0.0.1.nip.io:8765": false,
	} {
		if got := LoopbackHost(host); got != want {
			t.Errorf("LoopbackHost(%q) = %v, want %v", host, got, want)
		}
	}
}

// TestRequireLoopbackHost: a DNS-rebound page (Host: attacker's name resolving to
// 127.0.0.1) is refused; the loopback names are served.
func TestRequireLoopbackHost(t *testing.T) {
	h := RequireLoopbackHost(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok")) }))
	for host, want := range map[string]int{"127.0.0.1:8765": 200, "localhost:8765": 200, "rebind.example:8765": http.StatusMisdirectedRequest} {
		r := httptest.NewRequest("GET", "/metrics", nil)
		r.Host = host
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != want {
			t.Errorf("Host %s: %d, want %d", host, w.Code, want)
		}
	}
}

// FuzzLoopbackHost: whatever the Host header holds, an accepted one names loopback.
// Seeds in testdata/fuzz/FuzzLoopbackHost.
func FuzzLoopbackHost(f *testing.F) {
	for _, s := range []string{"127.0.0.1:8765", "[::1]:1", "localhost", "evil.example", "[::ffff:127.0.0.1]:80", "127.0.0.1%eth0:1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, host string) {
		if !LoopbackHost(host) {
			return
		}
		h := host
		if hh, _, err := net.SplitHostPort(host); err == nil {
			h = hh
		}
		h = strings.Trim(h, "[]")
		if strings.EqualFold(strings.TrimSuffix(h, "."), "localhost") {
			return
		}
		if ip := net.ParseIP(h); ip == nil || !ip.IsLoopback() {
			t.Fatalf("accepted %q", host)
		}
	})
}
