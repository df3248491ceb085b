package localapi

import (
	"context"
	"net/http"

	"github.com/klbr-dev/klbr/internal/api"
	"github.com/klbr-dev/klbr/internal/datadir"
)

// Collector runs garbage collection while klbr-core serves.
type Collector interface {
	GC(ctx context.Context) (datadir.GCResult, error)
}

// WithGC lets `klbr-core gc` run online (POST /v1/gc).
func (s *Server) WithGC(c Collector) *Server {
	s.gc = c
	return s
}

func (s *Server) handleGC(w http.ResponseWriter, r *http.Request) {
	if s.gc == nil {
		writeError(w, http.StatusServiceUnavailable, api.CodeUnavailable, "this klbr-core does not collect online; stop it and run klbr-core gc --offline")
		return
	}
	res, err := s.gc.GC(r.Context())
	if err != nil {
		s.fail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}
