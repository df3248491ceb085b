package discord

import (
	"strings"
	"testing"
)

// FuzzFormErrors: Discord's refusal bodies are outside input; rendering
// them never panics and stays bounded.
func FuzzFormErrors(f *testing.F) {
	f.Add([]byte(`{"code":50035,"message":"Invalid Form Body","errors":{"content":{"_errors":[{"code":"BASE_TYPE_MAX_LENGTH","message":"Must be 2000 or fewer in length."}]}}}`))
	f.Add([]byte(`{"code":50035,"errors":{"embeds":{"0":{"title":{"_errors":[{"message":"too long"}]}}}}}`))
	f.Add([]byte(`{"code":50035,"errors":{"a":{"b":{"c":{"d":{"e":{"f":{"g":{"_errors":[{"message":"deep"}]}}}}}}}}}`))
	f.Add([]byte(`{"code":50006,"message":"Cannot send an empty message"}`))
	f.Add([]byte(`not json`))
	f.Fuzz(func(t *testing.T, b []byte) {
		out := formErrors(b)
		if len(out) > maxFormErrors*(256+2) {
			t.Fatalf("%d bytes rendered", len(out))
		}
	})
}

func TestFormErrorsNamesTheField(t *testing.T) {
	got := formErrors([]byte(`{"code":50035,"message":"Invalid Form Body","errors":{"content":{"_errors":[{"code":"BASE_TYPE_MAX_LENGTH","message":"Must be 2000 or fewer in length."}]},"embeds":{"0":{"title":{"_errors":[{"message":"too long"}]}}}}}`))
	if got != "content: Must be 2000 or fewer in length.; embeds.0.title: too long" {
		t.Fatalf("got %q", got)
	}
	if strings.Contains(formErrors([]byte(`{"code":50006,"errors":{"x":{"_errors":[{"message":"m"}]}}}`)), "m") {
		t.Fatal("a body that is not 50035 rendered field errors")
	}
}
