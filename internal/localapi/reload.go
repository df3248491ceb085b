package localapi

import (
	"context"
	"errors"
	"net/http"

	"github.com/klbr-dev/klbr/internal/api"
)

// Reloader rereads klbr.toml and applies what can change live.
type Reloader func(ctx context.Context) (api.Reloaded, error)

// ErrConfigRefused marks a reread klbr.toml that was refused (it does not
// parse, or its agent route cannot be built): the running one stays.
var ErrConfigRefused = errors.New("klbr.toml refused; the running configuration stays")

// WithReload serves POST /v1/reload (klbr-core reload).
func (s *Server) WithReload(r Reloader) *Server {
	s.reload = r
	return s
}

func (s *Server) handleReload(w http.ResponseWriter, r *http.Request) {
	if s.reload == nil {
		writeError(w, http.StatusServiceUnavailable, api.CodeUnavailable, "this daemon cannot reload its configuration")
		return
	}
	out, err := s.reload(r.Context())
	switch {
	case errors.Is(err, ErrConfigRefused):
		writeError(w, http.StatusUnprocessableEntity, api.CodeRefused, err.Error())
	case err != nil:
		s.fail(w, err)
	default:
		writeJSON(w, http.StatusOK, out)
	}
}
