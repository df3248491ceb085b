package localapi

import (
	"errors"
	"net/http"
	"strconv"
	"strings"

	"github.com/klbr-dev/klbr/internal/api"
	"github.com/klbr-dev/klbr/internal/store"
)

// MaxItemsPage bounds one listing of attention items.
const MaxItemsPage = 500

// handleItems lists a session's attention items, newest first:
// GET /v1/sessions/{session}/items?status=pending,seen&limit=N.
func (s *Server) handleItems(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("session")
	if _, err := s.store.Session(r.Context(), id); err != nil {
		s.fail(w, err)
		return
	}
	var statuses []string
	if q := r.URL.Query().Get("status"); q != "" {
		for _, st := range strings.Split(q, ",") {
			switch st {
			case store.ItemPending, store.ItemSeen, store.ItemActed, store.ItemIgnored:
				statuses = append(statuses, st)
			default:
				writeError(w, http.StatusBadRequest, api.CodeInvalid, "status: "+strconv.Quote(st)+" is not pending, seen, acted or ignored")
				return
			}
		}
	}
	limit := 100
	if q := r.URL.Query().Get("limit"); q != "" {
		n, err := strconv.Atoi(q)
		if err != nil || n < 1 || n > MaxItemsPage {
			writeError(w, http.StatusBadRequest, api.CodeInvalid, "limit must be 1 to "+strconv.Itoa(MaxItemsPage))
			return
		}
		limit = n
	}
	items, err := s.store.AttentionItems(r.Context(), id, statuses, limit)
	if err != nil {
		s.fail(w, err)
		return
	}
	if items == nil {
		items = []store.AttentionItem{}
	}
	writeJSON(w, http.StatusOK, api.Items{Items: items})
}

// handleMark records an operator's decision on an attention item:
// POST /v1/items/{item}/mark {"status", "note"}; decision_origin operator.
func (s *Server) handleMark(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.ParseInt(r.PathValue("item"), 10, 64)
	if err != nil || id < 1 {
		writeError(w, http.StatusBadRequest, api.CodeInvalid, "item must be a positive integer")
		return
	}
	var req api.MarkRequest
	if !decodeRequest(w, r, &req) {
		return
	}
	if len(req.Note) > 1000 {
		writeError(w, http.StatusBadRequest, api.CodeInvalid, "note: at most 1000 bytes")
		return
	}
	if err := s.store.Write(r.Context(), func(tx *store.Tx) error {
		_, err := tx.Mark(id, req.Status, store.OriginOperator, req.Note, 0)
		return err
	}); err != nil {
		switch {
		case errors.Is(err, store.ErrUnknownItem):
			writeError(w, http.StatusNotFound, api.CodeNotFound, err.Error())
		case errors.Is(err, store.ErrAttentionMove):
			writeError(w, http.StatusConflict, api.CodeConflict, err.Error())
		default:
			s.fail(w, err)
		}
		return
	}
	it, err := s.store.AttentionItem(r.Context(), id)
	if err != nil {
		s.fail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, it)
}
