package discord

import "testing"

// FuzzParseRefreshed: refresh-urls' answer comes from outside; the link it
// returns is the one asked for, bounded, or an error — never a panic.
func FuzzParseRefreshed(f *testing.F) {
	const link = "https://cdn.discordapp.com/attachments/1/2/a.png?ex=1&is=1&hm=00"
	f.Add([]byte(`{"refreshed_urls":[{"original":"`+link+`","refreshed":"https://cdn.discordapp.com/attachments/1/2/a.png?ex=2&is=2&hm=11"}]}`), link)
	f.Add([]byte(`{"refreshed_urls":[]}`), link)
	f.Add([]byte(`{"refreshed_urls":null}`), "")
	f.Add([]byte(`[`), link)
	f.Fuzz(func(t *testing.T, b []byte, asked string) {
		got, err := parseRefreshed(b, asked)
		if err != nil {
			return
		}
		if got == "" || len(got) > 2048 {
			t.Fatalf("parseRefreshed(%q) = %q", b, got)
		}
	})
}
