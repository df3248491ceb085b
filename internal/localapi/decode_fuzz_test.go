package localapi

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"
	"unicode/utf8"

	"github.com/klbr-dev/klbr/internal/api"
)

// FuzzDecodeSendRequest drives the operator API's request decoder with
// arbitrary bodies. Seeds live in testdata/fuzz/FuzzDecodeSendRequest and run
// as ordinary tests.
func FuzzDecodeSendRequest(f *testing.F) {
	f.Add([]byte(`{"text":"hello","source_key":"k"}`))
	f.Add([]byte(`{"text":"a\u0000b","source_key":"k","occurred_at":"2026-01-02T03:04:05Z"}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		var req api.SendRequest
		err := decodeBody(bytes.NewReader(body), api.MaxRequestBytes, &req)
		if err != nil {
			return
		}
		if !utf8.Valid(body) {
			t.Fatalf("accepted invalid UTF-8: %q", body)
		}
		if len(body) > api.MaxRequestBytes {
			t.Fatalf("accepted %d bytes", len(body))
		}
		// What was accepted survives a round trip unchanged.
		again, err := json.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		var back api.SendRequest
		if err := decodeJSON(again, &back); err != nil {
			t.Fatalf("re-decode of %s: %v", again, err)
		}
		if !reflect.DeepEqual(req.Text, back.Text) || req.SourceKey != back.SourceKey {
			t.Fatalf("round trip changed the request: %+v → %+v", req, back)
		}
	})
}
