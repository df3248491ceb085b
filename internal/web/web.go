// Package web serves klbr-core's HTTP listener: health, metrics, and the
// browser client (its page, /v2/status and the /v2/ws socket). It binds
// loopback only.
package web

import (
	"encoding/json"
	"log/slog"
	"net"
	"net/http"
	"sync"

	"github.com/klbr-dev/klbr/internal/httpguard"
)

// Health reports whether the daemon is serving or draining.
type Health interface {
	Draining() bool
}

// Server is the HTTP listener's handler set.
type Server struct {
	health  Health
	metrics http.Handler
	log     *slog.Logger
	browser *browser // nil until WithBrowser: / then serves a placeholder
	// Limits are the listener's timeouts and connection bounds: Limits.Conns() places
	// for connections that presented the operator token, Limits.Strangers for the others
	// (see httpguard.Gate).
	Limits httpguard.Limits

	gateOnce sync.Once
	gateV    *httpguard.Gate
}

// New returns the HTTP server's handler set. Without WithBrowser it serves
// /healthz, /metrics and a placeholder page.
func New(health Health, metrics http.Handler, log *slog.Logger) *Server {
	return &Server{health: health, metrics: metrics, log: log}
}

// HTTPServer returns the http.Server for the loopback listener; it serves a listener
// wrapped by Listener.
func (s *Server) HTTPServer() *http.Server {
	g := s.gate()
	return g.Serve(httpguard.Apply(&http.Server{
		Handler:  g.Handler(s.Handler()),
		ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}, s.Limits))
}

// Listener wraps the loopback listener in the gate that keeps places for the operator:
// a flood of connections without the token (idle, slow headers, refused upgrades) cannot
// hold them all (httpguard.Gate).
func (s *Server) Listener(l net.Listener) net.Listener { return s.gate().Listener(l) }

// GateStats reports the listener gate's counts.
func (s *Server) GateStats() httpguard.GateStats { return s.gate().Stats() }

func (s *Server) gate() *httpguard.Gate {
	s.gateOnce.Do(func() { s.gateV = httpguard.NewGate(s.Limits) })
	return s.gateV
}

// Handler routes the listener. /healthz and /metrics are open; everything
// else needs the operator token (see WithBrowser).
func (s *Server) Handler() http.Handler {
	return httpguard.RequireLoopbackHost(s.routes())
}

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", s.handleHealth)
	mux.Handle("GET /metrics", s.metrics)
	if s.browser != nil {
		s.browser.routes(mux)
		return mux
	}
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Write([]byte("klbr-core is running. The browser client is not built yet; use `klbr-core send` and `klbr-core tail`.\n"))
	})
	return mux
}

func (s *Server) handleHealth(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	if s.health.Draining() {
		w.WriteHeader(http.StatusServiceUnavailable)
		json.NewEncoder(w).Encode(map[string]string{"status": "draining"})
		return
	}
	json.NewEncoder(w).Encode(map[string]string{"status": "ok"})
}
