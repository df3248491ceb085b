package localapi

import (
	"context"
	"errors"
	"net/http"
	"strconv"

	"github.com/klbr-dev/klbr/internal/api"
	"github.com/klbr-dev/klbr/internal/store"
)

// Jobs cancels durable jobs (package jobs); listing reads the store.
type Jobs interface {
	Cancel(ctx context.Context, id int64) (store.Job, error)
}

// WithJobs serves job cancellation; listing and reading are served either way.
func (s *Server) WithJobs(j Jobs) *Server {
	s.jobs = j
	return s
}

func (s *Server) routeJobs(mux *http.ServeMux) {
	mux.HandleFunc("GET /v1/jobs", s.handleJobs)
	mux.HandleFunc("GET /v1/jobs/{id}", s.handleJob)
	mux.HandleFunc("POST /v1/jobs/{id}/cancel", s.handleJobCancel)
}

var jobStates = map[string]bool{"": true, "pending": true, "running": true, "succeeded": true, "failed": true, "cancelled": true, "unknown": true}

func (s *Server) handleJobs(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit, err := queryInt(q.Get("limit"), 100)
	if err != nil || limit < 1 || limit > 1000 {
		writeError(w, http.StatusBadRequest, api.CodeInvalid, "limit must be an integer in 1..1000")
		return
	}
	if !jobStates[q.Get("state")] {
		writeError(w, http.StatusBadRequest, api.CodeInvalid, "state must be pending, running, succeeded, failed, cancelled or unknown")
		return
	}
	session := q.Get("session")
	if session != "" {
		if _, err := s.store.Session(r.Context(), session); err != nil {
			s.fail(w, err)
			return
		}
	}
	js, err := s.store.Jobs(r.Context(), store.JobFilter{Session: session, State: store.JobState(q.Get("state")), Limit: int(limit)})
	if err != nil {
		s.fail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, api.Jobs{Jobs: js})
}

func (s *Server) jobID(w http.ResponseWriter, r *http.Request) (int64, bool) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id < 1 {
		writeError(w, http.StatusBadRequest, api.CodeInvalid, "a job id is a positive integer")
		return 0, false
	}
	return id, true
}

func (s *Server) handleJob(w http.ResponseWriter, r *http.Request) {
	id, ok := s.jobID(w, r)
	if !ok {
		return
	}
	j, err := s.store.Job(r.Context(), id)
	if err != nil {
		s.jobFail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, j)
}

func (s *Server) handleJobCancel(w http.ResponseWriter, r *http.Request) {
	id, ok := s.jobID(w, r)
	if !ok {
		return
	}
	if s.jobs == nil {
		writeError(w, http.StatusServiceUnavailable, api.CodeUnavailable, "jobs do not run in this daemon")
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), commitTimeout)
	defer cancel()
	j, err := s.jobs.Cancel(ctx, id)
	if err != nil {
		s.jobFail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, j)
}

func (s *Server) jobFail(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, store.ErrNoJob):
		writeError(w, http.StatusNotFound, api.CodeNotFound, err.Error())
	case errors.Is(err, store.ErrJobState):
		writeError(w, http.StatusConflict, api.CodeConflict, err.Error())
	default:
		s.fail(w, err)
	}
}
