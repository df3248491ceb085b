package localapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"unicode/utf8"

	"github.com/klbr-dev/klbr/internal/api"
)

// errTooLarge marks a body over the bound.
var errTooLarge = errors.New("request body too large")

// decodeBody reads one JSON object of at most max bytes into v. It refuses
// invalid UTF-8 before decoding (encoding/json would quietly replace it),
// unknown fields, trailing data, and a body that ends early.
func decodeBody(r io.Reader, max int64, v any) error {
	body, err := io.ReadAll(io.LimitReader(r, max+1))
	if err != nil {
		return fmt.Errorf("read request body: %w", err)
	}
	if int64(len(body)) > max {
		return fmt.Errorf("%w: more than %d bytes", errTooLarge, max)
	}
	return decodeJSON(body, v)
}

// decodeJSON is the pure part of decodeBody, which the fuzz test drives.
func decodeJSON(body []byte, v any) error {
	if !utf8.Valid(body) {
		return errors.New("request body is not valid UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.EOF) {
			return errors.New("request body is empty; want a JSON object")
		}
		return fmt.Errorf("malformed JSON: %w", err)
	}
	if dec.More() {
		return errors.New("malformed JSON: data after the object")
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("malformed JSON: data after the object")
	}
	return nil
}

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
