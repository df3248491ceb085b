package config

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/pelletier/go-toml/v2"
)

// Error is a configuration error at a place in a TOML file. Every error
// Parse returns is an *Error, or several of them joined with errors.Join;
// Errors takes them apart again.
type Error struct {
	File   string // the file name given to Parse
	Line   int    // 1-based line; 0 when the error has no place in a document
	Column int    // 1-based byte column within Line
	Key    string // dotted TOML key the error is about, e.g. routes.main.url; may be empty
	Msg    string // what is wrong, and where useful what is accepted
}

// Error formats e as "file:line:column: key: message", leaving out the parts
// that are unknown.
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		if e.File != "" {
			b.WriteByte(':')
		}
		b.WriteString(strconv.Itoa(e.Line) + ":" + strconv.Itoa(e.Column))
	}
	if b.Len() > 0 {
		b.WriteString(": ")
	}
	if e.Key != "" {
		b.WriteString(e.Key + ": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Errors returns the *Error values err carries, in order: one for an *Error,
// each of them for errors joined by Parse, none when err has none.
func Errors(err error) []*Error {
	if err == nil {
		return nil
	}
	if multi, ok := err.(interface{ Unwrap() []error }); ok {
		var out []*Error
		for _, e := range multi.Unwrap() {
			out = append(out, Errors(e)...)
		}
		return out
	}
	var e *Error
	if errors.As(err, &e) {
		return []*Error{e}
	}
	return nil
}

// joinErrors sorts errs by their place in the document and returns nil, the
// single *Error, or all of them joined.
func joinErrors(errs []*Error) error {
	slices.SortStableFunc(errs, func(a, b *Error) int {
		if c := a.Line - b.Line; c != 0 {
			return c
		}
		if c := a.Column - b.Column; c != 0 {
			return c
		}
		return strings.Compare(a.Key, b.Key)
	})
	switch len(errs) {
	case 0:
		return nil
	case 1:
		return errs[0]
	}
	all := make([]error, len(errs))
	for i, e := range errs {
		all[i] = e
	}
	return errors.Join(all...)
}

// decodeErrors turns what go-toml's strict decoder returned into *Error
// values. A syntax error or a type mismatch stops decoding, so fatal reports
// whether the decoded value is unusable; unknown keys leave it usable.
func decodeErrors(name string, err error) (errs []*Error, fatal bool) {
	var strict *toml.StrictMissingError
	if errors.As(err, &strict) {
		for i := range strict.Errors {
			de := &strict.Errors[i]
			line, col := de.Position()
			errs = append(errs, &Error{
				File: name, Line: line, Column: col,
				Key: formatKey(de.Key()...),
				Msg: "unknown key",
			})
		}
		return errs, false
	}
	var de *toml.DecodeError
	if errors.As(err, &de) {
		line, col := de.Position()
		return []*Error{{
			File: name, Line: line, Column: col,
			Key: formatKey(de.Key()...),
			Msg: decodeMessage(strings.TrimPrefix(de.Error(), "toml: ")),
		}}, true
	}
	return []*Error{{File: name, Msg: err.Error()}}, true
}

// decodeMessage rewrites go-toml's type mismatch message, which names Go
// types ("cannot decode TOML string into struct field config.Discord.Enabled
// of type bool"), in the terms of the file ("expected a boolean, not a TOML
// string"). Other messages pass through unchanged.
func decodeMessage(msg string) string {
	rest, ok := strings.CutPrefix(msg, "cannot decode TOML ")
	if !ok {
		return msg
	}
	found, target, ok := strings.Cut(rest, " into ")
	if !ok {
		return msg
	}
	if i := strings.LastIndex(target, " of type "); i >= 0 {
		target = target[i+len(" of type "):]
	}
	var want string
	switch {
	case target == "bool":
		want = "a boolean"
	case target == "string":
		want = "a string"
	case strings.HasPrefix(target, "int") || strings.HasPrefix(target, "uint"):
		want = "an integer"
	case strings.HasPrefix(target, "float"):
		want = "a number"
	case strings.HasPrefix(target, "[]"):
		want = "an array"
	case strings.HasPrefix(target, "map[") || strings.HasPrefix(target, "config."):
		want = "a table"
	default:
		return msg
	}
	return fmt.Sprintf("expected %s, not a TOML %s", want, found)
}
