package localapi

import (
	"context"
	"net/http"

	"github.com/klbr-dev/klbr/internal/api"
)

// Replayer replays an observer's events with fake effects (package observe).
type Replayer func(ctx context.Context, session string, req api.ReplayRequest) (api.Replay, error)

// WithReplay lets the API replay observers' events.
func (s *Server) WithReplay(r Replayer) *Server {
	s.replay = r
	return s
}

func (s *Server) handleReplay(w http.ResponseWriter, r *http.Request) {
	var req api.ReplayRequest
	if !decodeRequest(w, r, &req) {
		return
	}
	if s.replay == nil {
		writeError(w, http.StatusServiceUnavailable, api.CodeUnavailable, "observers do not run here (cells cannot run)")
		return
	}
	if req.Handler == "" || len(req.Handler) > 64 || req.From < 0 || req.To < 0 {
		writeError(w, http.StatusBadRequest, api.CodeInvalid, "replay needs a handler (at most 64 bytes) and non-negative event ids")
		return
	}
	res, err := s.replay(r.Context(), r.PathValue("session"), req)
	if err != nil {
		s.fail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}
