package daemon

import "testing"

// TestLocalhostBindsTheLoopbackLiteral: "localhost" is never handed to the resolver,
// which a hosts file can point anywhere.
func TestLocalhostBindsTheLoopbackLiteral(t *testing.T) {
	for in, want := range map[string]string{
		"localhost:8765":   "127.0.0.1:8765",
		"LOCALHOST.:0":     "127.0.0.1:0",
		"127.0.0.2:8765":   "127.0.0.2:8765",
		"[::1]:8765":       "[::1]:8765",
		"localhost.evil:1": "localhost.evil:1",
	} {
		if got := loopbackLiteral(in); got != want {
			t.Errorf("loopbackLiteral(%q) = %q, want %q", in, got, want)
		}
	}
}
