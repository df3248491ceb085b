package discord

import (
	"slices"
	"testing"
)

// FuzzParseThreadCreate: a THREAD_CREATE is outside input; parsing never
// panics, refuses what is past its bound, and what it accepts names
// Discord ids and a thread type.
func FuzzParseThreadCreate(f *testing.F) {
	f.Add([]byte(`{"id":"13001","guild_id":"7","parent_id":"70","type":11,"newly_created":true,"thread_metadata":{"archived":false}}`))
	f.Add([]byte(`{"id":"13001","guild_id":"7","parent_id":"70","type":12,"member":{"user_id":"99"},"thread_metadata":{"archived":true}}`))
	f.Add([]byte(`{"id":"13001","guild_id":"7","parent_id":"70","type":0}`))
	f.Add([]byte(`{"id":"x","parent_id":null,"member":null}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		th, err := ParseThreadCreate(b)
		if err != nil {
			return
		}
		if len(b) > MaxThreadEventBytes || !snowflake(th.ID) || !snowflake(th.ParentID) || !snowflake(th.GuildID) || !slices.Contains(threadTypes, th.Type) {
			t.Fatalf("accepted %+v from %q", th, b)
		}
	})
}

// FuzzProbeDecoders: the probe reads a history message's id and time, and a
// MESSAGE_CREATE's id and channel, from outside input.
func FuzzProbeDecoders(f *testing.F) {
	f.Add([]byte(`{"id":"12001","channel_id":"50","timestamp":"2024-01-01T00:00:00Z"}`))
	f.Add([]byte(`{"id":"12001","channel_id":"50"}`))
	f.Add([]byte(`{"id":"1e3","channel_id":5}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		if id, _, ok := newestOf(b); ok && !snowflake(id) {
			t.Fatalf("newestOf accepted id %q", id)
		}
		if id, ch, ok := eventChannel(b); ok && (!snowflake(id) || !snowflake(ch)) {
			t.Fatalf("eventChannel accepted %q %q", id, ch)
		}
	})
}

// FuzzParseActiveThreads: GET /guilds/{id}/threads/active is outside input;
// parsing never panics, refuses what is past its bound, keeps at most
// maxStartThreads, and what it accepts names Discord ids and a thread type.
func FuzzParseActiveThreads(f *testing.F) {
	f.Add([]byte(`{"threads":[{"id":"14010","guild_id":"7","parent_id":"70","type":11,"thread_metadata":{"archived":false}}],"members":[{"id":"14010","user_id":"99"}]}`))
	f.Add([]byte(`{"threads":[{"id":"14010","guild_id":"7","parent_id":"70","type":0}],"members":[]}`))
	f.Add([]byte(`{"threads":null,"members":[{"id":5}]}`))
	f.Add([]byte(`{"threads":[1,"x",{}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		ths, err := ParseActiveThreads(b)
		if err != nil {
			return
		}
		if len(b) > MaxActiveThreadsBytes || len(ths) > maxStartThreads {
			t.Fatalf("accepted %d threads from %d bytes", len(ths), len(b))
		}
		for _, th := range ths {
			if !snowflake(th.ID) || !snowflake(th.ParentID) || !snowflake(th.GuildID) || !slices.Contains(threadTypes, th.Type) {
				t.Fatalf("accepted %+v from %q", th, b)
			}
		}
	})
}
