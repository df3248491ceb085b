package localapi

import "net/http"

// GET /v1/sessions/{session}/usage: what the session's model requests cost
// as the store records them (store.SessionUsage); `klbr-core sessions`
// shows it for each child.
func (s *Server) routeUsage(mux *http.ServeMux) {
	mux.HandleFunc("GET /v1/sessions/{session}/usage", s.handleUsage)
}

func (s *Server) handleUsage(w http.ResponseWriter, r *http.Request) {
	u, err := s.store.SessionUsage(r.Context(), r.PathValue("session"))
	if err != nil {
		s.fail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, u)
}
