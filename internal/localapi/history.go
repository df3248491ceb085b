package localapi

import (
	"context"
	"errors"
	"net/http"
	"strconv"

	"github.com/klbr-dev/klbr/internal/api"
	"github.com/klbr-dev/klbr/internal/history"
	"github.com/klbr-dev/klbr/internal/store"
)

// Compacter runs a manual compaction of a session's context.
type Compacter func(ctx context.Context, session string) (history.Result, error)

// WithHistory serves history search and reads, and manual compaction.
func (s *Server) WithHistory(r *history.Reader, compact Compacter) *Server {
	s.history, s.compact = r, compact
	return s
}

func (s *Server) routeHistory(mux *http.ServeMux) {
	mux.HandleFunc("POST /v1/sessions/{session}/compact", s.handleCompact)
	mux.HandleFunc("GET /v1/sessions/{session}/history", s.handleHistorySearch)
	mux.HandleFunc("GET /v1/history/{ref}", s.handleHistoryRead)
	mux.HandleFunc("GET /v1/history/{ref}/children", s.handleHistoryChildren)
}

func (s *Server) handleCompact(w http.ResponseWriter, r *http.Request) {
	if s.compact == nil {
		writeError(w, http.StatusServiceUnavailable, api.CodeUnavailable, "compaction is not available in this daemon")
		return
	}
	session := r.PathValue("session")
	if _, err := s.store.Session(r.Context(), session); err != nil {
		s.fail(w, err)
		return
	}
	res, err := s.compact(r.Context(), session)
	switch {
	case errors.Is(err, history.ErrNothingToCompact):
		writeError(w, http.StatusConflict, api.CodeConflict, err.Error())
		return
	case errors.Is(err, history.ErrUnavailable):
		writeError(w, http.StatusServiceUnavailable, api.CodeUnavailable, err.Error())
		return
	case err != nil:
		s.fail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, api.NewCompacted(session, res))
}

func (s *Server) handleHistorySearch(w http.ResponseWriter, r *http.Request) {
	if s.history == nil {
		writeError(w, http.StatusServiceUnavailable, api.CodeUnavailable, "history is not available in this daemon")
		return
	}
	q := r.URL.Query()
	limit, err := strconv.Atoi(q.Get("limit"))
	if q.Get("limit") == "" {
		limit, err = 20, nil
	}
	before, err2 := queryInt(q.Get("before"), 0)
	if err != nil || err2 != nil {
		writeError(w, http.StatusBadRequest, api.CodeInvalid, "limit and before must be integers")
		return
	}
	res, err := s.history.Search(r.Context(), "", q.Get("q"), history.Scope{Session: r.PathValue("session"), Conversation: q.Get("conversation"),
		Lane: q.Get("lane"), Since: q.Get("since"), Until: q.Get("until"), Before: before}, limit)
	if err != nil {
		s.historyFail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

func (s *Server) handleHistoryRead(w http.ResponseWriter, r *http.Request) {
	if s.history == nil {
		writeError(w, http.StatusServiceUnavailable, api.CodeUnavailable, "history is not available in this daemon")
		return
	}
	q := r.URL.Query()
	maxBytes, err := queryInt(q.Get("max_bytes"), history.DefaultReadBytes)
	offset, err2 := queryInt(q.Get("offset"), 0)
	if err != nil || err2 != nil {
		writeError(w, http.StatusBadRequest, api.CodeInvalid, "max_bytes and offset must be integers")
		return
	}
	if q.Get("describe") != "" {
		d, err := s.history.Describe(r.Context(), "", r.PathValue("ref"))
		if err != nil {
			s.historyFail(w, err)
			return
		}
		writeJSON(w, http.StatusOK, d)
		return
	}
	res, err := s.history.Read(r.Context(), "", r.PathValue("ref"), int(min(maxBytes, 1<<30)), offset)
	if err != nil {
		s.historyFail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

func (s *Server) handleHistoryChildren(w http.ResponseWriter, r *http.Request) {
	if s.history == nil {
		writeError(w, http.StatusServiceUnavailable, api.CodeUnavailable, "history is not available in this daemon")
		return
	}
	res, err := s.history.Children(r.Context(), "", r.PathValue("ref"))
	if err != nil {
		s.historyFail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

func (s *Server) historyFail(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, store.ErrUnknownRef), errors.Is(err, store.ErrUnknownSession):
		writeError(w, http.StatusNotFound, api.CodeNotFound, err.Error())
	case errors.Is(err, context.Canceled):
	default:
		writeError(w, http.StatusBadRequest, api.CodeInvalid, err.Error())
	}
}
