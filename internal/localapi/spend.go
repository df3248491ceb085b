package localapi

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/klbr-dev/klbr/internal/api"
)

// Spender reads the spend ledger and sets the operator's caps.
type Spender interface {
	Spend(ctx context.Context, by string, since time.Time) (api.Spend, error)
	// SetSpendCap records a daily or monthly cap durably and applies it
	// at once; an error wrapping ErrInvalidCap is the caller's.
	SetSpendCap(ctx context.Context, name string, usd float64) error
}

// ErrInvalidCap marks a cap that is refused.
var ErrInvalidCap = errors.New("invalid spend cap")

// WithSpend serves the spend ledger and caps.
func (s *Server) WithSpend(sp Spender) *Server {
	s.spend = sp
	return s
}

func (s *Server) routeSpend(mux *http.ServeMux) {
	mux.HandleFunc("GET /v1/spend", s.handleSpend)
	mux.HandleFunc("POST /v1/spend/caps/{name}", s.handleSpendCap)
}

func (s *Server) handleSpend(w http.ResponseWriter, r *http.Request) {
	if s.spend == nil {
		writeError(w, http.StatusServiceUnavailable, api.CodeUnavailable, "spend is not available in this daemon")
		return
	}
	q := r.URL.Query()
	var since time.Time
	if v := q.Get("since"); v != "" {
		t, err := time.Parse(time.RFC3339, v)
		if err != nil {
			writeError(w, http.StatusBadRequest, api.CodeInvalid, "since must be an RFC 3339 time")
			return
		}
		since = t
	}
	by := q.Get("by")
	if by == "" {
		by = "day"
	}
	out, err := s.spend.Spend(r.Context(), by, since)
	if err != nil {
		writeError(w, http.StatusBadRequest, api.CodeInvalid, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) handleSpendCap(w http.ResponseWriter, r *http.Request) {
	if s.spend == nil {
		writeError(w, http.StatusServiceUnavailable, api.CodeUnavailable, "spend caps are not available: the agent does not run")
		return
	}
	var body api.SpendCap
	if !decodeRequest(w, r, &body) {
		return
	}
	err := s.spend.SetSpendCap(r.Context(), r.PathValue("name"), body.USD)
	switch {
	case errors.Is(err, ErrInvalidCap):
		writeError(w, http.StatusBadRequest, api.CodeInvalid, err.Error())
		return
	case err != nil:
		s.fail(w, err)
		return
	}
	out, err := s.spend.Spend(r.Context(), "route", time.Now().Add(-24*time.Hour))
	if err != nil {
		s.fail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}
