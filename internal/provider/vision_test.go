package provider

import (
	"encoding/json"
	"testing"

	"github.com/klbr-dev/klbr/internal/config"
)

// A user message's images go to a route with vision = true as OpenAI
// image_url parts with data URLs after the text part; a route without
// vision gets the text alone (it carries the attachment lines).
func TestImagesGoOnlyToAVisionRoute(t *testing.T) {
	msgs := []Message{{Role: "system", Content: "be brief"},
		{Role: "user", Content: "what is this?", Images: []Image{{MediaType: "image/png", Data: []byte("\x89PNG")}}}}
	for _, tc := range []struct {
		name   string
		vision bool
		want   string
	}{
		{"vision", true, `{"role":"user","content":[{"type":"text","text":"what is this?"},{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw=="}}]}`},
		{"no vision", false, `{"role":"user","content":"what is this?"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := New(config.Route{URL: "http://x/v1", Model: "m", Vision: tc.vision}, Options{})
			if err != nil {
				t.Fatal(err)
			}
			b, err := c.requestBody(Request{Messages: msgs})
			if err != nil {
				t.Fatal(err)
			}
			var body struct {
				Messages []json.RawMessage `json:"messages"`
			}
			if err := json.Unmarshal(b, &body); err != nil {
				t.Fatal(err)
			}
			if got := string(body.Messages[1]); got != tc.want {
				t.Fatalf("the user message went as\n%s\nwant\n%s", got, tc.want)
			}
		})
	}
}
