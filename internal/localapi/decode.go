package localapi

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"

	"github.com/klbr-dev/klbr/internal/api"
	"github.com/klbr-dev/klbr/internal/strictjson"
)

// errTooLarge marks a body over the bound.
var errTooLarge = strictjson.ErrTooLarge

// decodeBody reads one JSON object of at most max bytes into v, strictly
// (package strictjson).
func decodeBody(r io.Reader, max int64, v any) error { return strictjson.ReadBody(r, max, v) }

// decodeJSON is the pure part of decodeBody, which the fuzz test drives.
func decodeJSON(body []byte, v any) error { return strictjson.Decode(body, v) }

// decodeRequest decodes r's body into v, or writes the error answer and
// returns false.
func decodeRequest(w http.ResponseWriter, r *http.Request, v any) bool {
	err := decodeBody(r.Body, api.MaxRequestBytes, v)
	if err == nil {
		return true
	}
	if errors.Is(err, errTooLarge) {
		writeError(w, http.StatusRequestEntityTooLarge, api.CodeTooLarge, err.Error())
	} else {
		writeError(w, http.StatusBadRequest, api.CodeInvalid, err.Error())
	}
	return false
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, api.Error{Error: api.ErrorBody{Code: code, Message: msg}})
}
