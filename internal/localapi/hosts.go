package localapi

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/klbr-dev/klbr/internal/api"
	"github.com/klbr-dev/klbr/internal/hosts"
)

// Hosts are the worker hosts (package hosts).
type Hosts interface {
	Names() []string
	Inspect(ctx context.Context, host string) hosts.Info
}

// inspectTimeout bounds the asking of every host for GET /v1/hosts.
const inspectTimeout = 20 * time.Second

// WithHosts serves GET /v1/hosts from h; without, it lists no host.
func (s *Server) WithHosts(h Hosts) *Server {
	s.hosts = h
	return s
}

func (s *Server) routeHosts(mux *http.ServeMux) {
	mux.HandleFunc("GET /v1/hosts", s.handleHosts)
}

// handleHosts asks every host at once, over its one connection.
func (s *Server) handleHosts(w http.ResponseWriter, r *http.Request) {
	out := api.Hosts{Hosts: []api.HostReport{}}
	if s.hosts != nil {
		names := s.hosts.Names()
		out.Hosts = make([]api.HostReport, len(names))
		ctx, cancel := context.WithTimeout(r.Context(), inspectTimeout)
		defer cancel()
		var wg sync.WaitGroup
		for i, name := range names {
			wg.Go(func() {
				info := s.hosts.Inspect(ctx, name)
				out.Hosts[i] = api.HostReport{Info: info, Problems: append([]hosts.Problem{}, info.Problems()...)}
			})
		}
		wg.Wait()
	}
	writeJSON(w, http.StatusOK, out)
}
