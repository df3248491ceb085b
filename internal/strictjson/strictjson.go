// Package strictjson decodes one JSON object from outside input, bounded
// and strict: the one decoder the operator API, the ingress API and cells'
// host requests share.
package strictjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"unicode/utf8"
)

// ErrTooLarge marks a body over its bound.
var ErrTooLarge = errors.New("request body too large")

// ReadBody reads one JSON object of at most max bytes from r into v (Decode).
func ReadBody(r io.Reader, max int64, v any) error {
	body, err := io.ReadAll(io.LimitReader(r, max+1))
	if err != nil {
		return fmt.Errorf("read request body: %w", err)
	}
	if int64(len(body)) > max {
		return fmt.Errorf("%w: more than %d bytes", ErrTooLarge, max)
	}
	return Decode(body, v)
}

// Decode decodes body, one JSON object, into v. It refuses invalid UTF-8
// (encoding/json would quietly replace it), unknown fields, trailing data
// and an empty body.
func Decode(body []byte, v any) error {
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
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("malformed JSON: data after the object")
	}
	return nil
}
