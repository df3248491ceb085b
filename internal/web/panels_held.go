package web

// Held sends: the Discord sends and reactions delivery.review held, listed
// with their reasons, released or dropped by the operator from the page.
// The decision is the operator API's (klbr-core release / drop): the same
// store operation, the same rules (only a held effect can be decided, so a
// double click cannot send twice), the same notices to the model.

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/klbr-dev/klbr/internal/api"
	"github.com/klbr-dev/klbr/internal/store"
)

// MaxDecideBody bounds a POST /v2/held/{effect}/release or drop body.
const MaxDecideBody = 4096

// maxDecideNote bounds a decision's note, as the operator API does.
const maxDecideNote = 500

func (b *browser) heldRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /v2/held", b.guard(http.StatusUnauthorized, b.handleHeld))
	mux.HandleFunc("POST /v2/held/{effect}/release", b.guard(http.StatusUnauthorized, b.handleDecide(true)))
	mux.HandleFunc("POST /v2/held/{effect}/drop", b.guard(http.StatusUnauthorized, b.handleDecide(false)))
}

// heldView is GET /v2/held: the held effects, oldest first.
type heldView struct {
	Effects []store.Effect `json:"effects"`
}

func (b *browser) handleHeld(w http.ResponseWriter, r *http.Request) {
	es, err := b.Store.HeldEffects(r.Context(), store.MaxHeldPage)
	if err != nil {
		storeError(w, err)
		return
	}
	writeJSONStatus(w, http.StatusOK, heldView{Effects: es})
}

// decodeDecide decodes a decision's body: {"note": "..."} or {}.
func decodeDecide(body []byte) (string, error) {
	var req struct {
		Note string `json:"note"`
	}
	if len(body) > MaxDecideBody {
		return "", fmt.Errorf("%w: body over %d bytes", ErrBadMessage, MaxDecideBody)
	}
	dec := json.NewDecoder(strings.NewReader(string(body)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return "", fmt.Errorf("%w: %v", ErrBadMessage, err)
	}
	if dec.More() {
		return "", fmt.Errorf("%w: trailing data", ErrBadMessage)
	}
	if len(req.Note) > maxDecideNote || !utf8.ValidString(req.Note) {
		return "", fmt.Errorf("%w: note: at most %d bytes of UTF-8", ErrBadMessage, maxDecideNote)
	}
	return req.Note, nil
}

// handleDecide releases or drops a held effect in the operator's name. A
// browser must send it from this page's own origin, as JSON.
func (b *browser) handleDecide(release bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id, body, ok := b.pageAction(w, r, "a held effect's decision", "effect", MaxDecideBody)
		if !ok {
			return
		}
		note, err := decodeDecide(body)
		if err != nil {
			jsonError(w, http.StatusBadRequest, api.CodeInvalid, err.Error())
			return
		}
		by := "the operator (browser)"
		if note != "" {
			by += ": " + note
		}
		e, err := b.Store.DecideHeld(r.Context(), id, release, by)
		switch {
		case errors.Is(err, store.ErrUnknownEffect):
			jsonError(w, http.StatusNotFound, api.CodeNotFound, err.Error())
			return
		case errors.Is(err, store.ErrOutboxMove):
			jsonError(w, http.StatusConflict, api.CodeConflict, err.Error())
			return
		case err != nil:
			storeError(w, err)
			return
		}
		if release && b.Outbox != nil {
			b.Outbox()
		}
		b.log.Info("browser: held effect decided", "effect", id, "released", release)
		writeJSONStatus(w, http.StatusOK, e)
	}
}
