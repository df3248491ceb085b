package httpguard

import (
	"net/http"
	"net/http/httptest"
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
