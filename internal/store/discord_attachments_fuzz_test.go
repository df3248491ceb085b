package store

import (
	"testing"
	"unicode/utf8"
)

// FuzzParseAttachments: attachment metadata came from outside; reading it
// back never panics and stays bounded.
func FuzzParseAttachments(f *testing.F) {
	f.Add(`[{"id":"1","filename":"a.png","content_type":"image/png","size":10,"url":"https://cdn/x"}]`)
	f.Add(`[{"id":"1","filename":"\u00e9\u00e9","size":-5}]`)
	f.Add(`{"not":"a list"}`)
	f.Fuzz(func(t *testing.T, raw string) {
		as := parseAttachments(raw)
		if len(as) > maxAttachmentsShown {
			t.Fatalf("%d attachments", len(as))
		}
		for _, a := range as {
			if len(a.Filename) > maxAttachmentNameLen || a.Size < 0 || (utf8.ValidString(raw) && !utf8.ValidString(a.Filename)) {
				t.Fatalf("attachment out of bounds: %+v", a)
			}
		}
	})
}
