package web

import (
	"errors"
	"testing"
	"unicode/utf8"
)

// FuzzDecodeDecide: a held effect's decision body is outside input; the
// decoder never panics, refuses what is past its bounds with ErrBadMessage,
// and what it accepts is a bounded UTF-8 note.
func FuzzDecodeDecide(f *testing.F) {
	for _, s := range []string{`{}`, `{"note":"checked"}`, `{"note":1}`, `{"note":"x","extra":true}`, `{} {}`, `[]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		note, err := decodeDecide(b)
		if err != nil {
			if !errors.Is(err, ErrBadMessage) {
				t.Fatalf("error %v does not wrap ErrBadMessage", err)
			}
			return
		}
		if len(b) > MaxDecideBody || len(note) > maxDecideNote || !utf8.ValidString(note) {
			t.Fatalf("accepted %q from %d bytes", note, len(b))
		}
	})
}
