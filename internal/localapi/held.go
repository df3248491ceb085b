package localapi

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"unicode/utf8"

	"github.com/klbr-dev/klbr/internal/api"
	"github.com/klbr-dev/klbr/internal/store"
	"github.com/klbr-dev/klbr/internal/unixsock"
)

// MaxDecideNote bounds the note of a release or drop.
const MaxDecideNote = 500

// WithOutbox lets a release wake the transport's waiting claim at once.
func (s *Server) WithOutbox(kick func()) *Server {
	s.kick = kick
	return s
}

// handleHeld lists the Discord effects delivery.review held, waiting for the
// operator: GET /v1/held?limit=N.
func (s *Server) handleHeld(w http.ResponseWriter, r *http.Request) {
	limit := 100
	if q := r.URL.Query().Get("limit"); q != "" {
		n, err := strconv.Atoi(q)
		if err != nil || n < 1 || n > store.MaxHeldPage {
			writeError(w, http.StatusBadRequest, api.CodeInvalid, "limit must be 1 to "+strconv.Itoa(store.MaxHeldPage))
			return
		}
		limit = n
	}
	es, err := s.store.HeldEffects(r.Context(), limit)
	if err != nil {
		s.fail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, api.Held{Effects: es})
}

// handleDecide releases (POST /v1/held/{effect}/release) or drops (…/drop)
// a held effect, in the name of the operator the peer credentials show. A
// released effect goes to the transport like any other, with the nonce it
// was made with: it is sent at most once, and its receipt names the release.
func (s *Server) handleDecide(release bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id, err := strconv.ParseInt(r.PathValue("effect"), 10, 64)
		if err != nil || id < 1 {
			writeError(w, http.StatusBadRequest, api.CodeInvalid, "effect must be a positive integer (see klbr-core held)")
			return
		}
		var req api.DecideRequest
		if !decodeRequest(w, r, &req) {
			return
		}
		if len(req.Note) > MaxDecideNote || !utf8.ValidString(req.Note) {
			writeError(w, http.StatusBadRequest, api.CodeInvalid, fmt.Sprintf("note: at most %d bytes of UTF-8", MaxDecideNote))
			return
		}
		cred, _ := unixsock.FromContext(r.Context())
		by := fmt.Sprintf("the operator (uid %d, klbr-core)", cred.UID)
		if req.Note != "" {
			by += ": " + req.Note
		}
		e, err := s.store.DecideHeld(r.Context(), id, release, by)
		switch {
		case errors.Is(err, store.ErrUnknownEffect):
			writeError(w, http.StatusNotFound, api.CodeNotFound, err.Error()+" (see klbr-core held)")
			return
		case errors.Is(err, store.ErrOutboxMove):
			writeError(w, http.StatusConflict, api.CodeConflict, err.Error())
			return
		case err != nil:
			s.fail(w, err)
			return
		}
		if release && s.kick != nil {
			s.kick()
		}
		s.log.Info("held effect decided", "effect", id, "released", release, "peer_uid", cred.UID)
		writeJSON(w, http.StatusOK, e)
	}
}
