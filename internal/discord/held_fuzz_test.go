package discord

import (
	"testing"
)

// FuzzParseInteraction: an INTERACTION_CREATE is outside input, and its
// token goes into a URL path; parsing never panics, refuses what is past its
// bounds, and what it accepts names Discord ids and a token of URL-safe
// characters.
func FuzzParseInteraction(f *testing.F) {
	f.Add([]byte(`{"id":"1","application_id":"99","type":3,"token":"aW50:tok","channel_id":"5","user":{"id":"8"},"data":{"custom_id":"klbr:release:42","component_type":2},"message":{"id":"7","content":"held"}}`))
	f.Add([]byte(`{"id":"1","application_id":"99","type":3,"token":"t","member":{"user":{"id":"8"}},"data":{"custom_id":"x"}}`))
	f.Add([]byte(`{"id":"1","application_id":"99","type":3,"token":"../../webhooks/1/x","user":{"id":"8"}}`))
	f.Add([]byte(`{"id":"1","application_id":"99","type":3,"token":"t?x=1#","user":{"id":"8"}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		ix, err := ParseInteraction(b)
		if err != nil {
			return
		}
		if len(b) > MaxEventBytes || !snowflake(ix.ID) || !snowflake(ix.AppID) || !snowflake(ix.UserID) ||
			len(ix.Token) > MaxInteractionTokenBytes || !tokenRE.MatchString(ix.Token) || len(ix.CustomID) > 100 {
			t.Fatalf("accepted %+v from %q", ix, b)
		}
	})
}
