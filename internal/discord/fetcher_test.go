package discord

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/discordtest"
	"github.com/klbr-dev/klbr/internal/session"
	"github.com/klbr-dev/klbr/internal/store"
)

func dmWith(id, content string, atts ...map[string]any) map[string]any {
	m := discordtest.Message(id, "20", "", "5", content)
	l := make([]any, len(atts))
	for i, a := range atts {
		l[i] = a
	}
	m["attachments"] = l
	return m
}

func fetchState(t testing.TB, c *core, msg, id string) store.AttachmentTarget {
	t.Helper()
	a, err := c.store.AttachmentTarget(context.Background(), session.DefaultID, msg, id)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func outcome(t *testing.T, c *core, msg, id string) (state, code, sha string) {
	t.Helper()
	var att []store.Attachment
	items, err := c.store.AttentionItems(context.Background(), session.DefaultID, nil, 100)
	if err != nil {
		t.Fatal(err)
	}
	for _, it := range items {
		if it.MessageID == msg {
			att = it.Attachments
		}
	}
	for _, a := range att {
		if a.ID == id {
			return a.State, a.Error, a.SHA256
		}
	}
	t.Fatalf("no attachment %s on message %s", id, msg)
	return
}

// Attachments are fetched apart from admission: an image, an expired link
// the REST API refreshes, a 60 MB file, a link that never answers, a link
// whose file is gone and a 60 MB file announced as 1 KB each end fetched or
// with a recorded failure, and the message after them is admitted while the
// stalled fetch still hangs.
func TestAttachmentsAreFetchedApartFromAdmission(t *testing.T) {
	dir := t.TempDir()
	c := startCore(t, dir)
	fake := discordtest.New("999")
	defer fake.Close()
	release := make(chan struct{})
	fake.OnCDN = func(r *http.Request) {
		if strings.Contains(r.URL.Path, "stall") {
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}
	}
	defer close(release)
	runTransportWith(t, fake, c.socket, func(cfg *Config) { cfg.Fetch.Timeout = 3 * time.Second })

	png := bytes.Repeat([]byte("\x89PNG-pixels"), 10000)
	fake.Dispatch("MESSAGE_CREATE", dmWith("2001", "look", fake.Attachment("31", "20", "2001", "shot.png", "image/png", png, time.Hour)))
	fake.Dispatch("MESSAGE_CREATE", dmWith("2002", "old one", fake.Attachment("32", "20", "2002", "old.txt", "text/plain", []byte("refreshed bytes"), -time.Minute)))
	fake.Dispatch("MESSAGE_CREATE", dmWith("2003", "huge", fake.AttachmentOfSize("33", "20", "2003", "huge.bin", "", []byte("x"), 60<<20)))
	fake.Dispatch("MESSAGE_CREATE", dmWith("2004", "slow", fake.Attachment("34", "20", "2004", "stall.log", "text/plain", []byte("never"), time.Hour)))
	gone := fake.Attachment("35", "20", "2005", "gone.txt", "text/plain", []byte("gone"), -time.Minute)
	fake.Forget("20", "2005", "gone.txt")
	fake.Dispatch("MESSAGE_CREATE", dmWith("2005", "gone", gone))
	// A 60 MB file announced as 1 KB: the bytes, not the announcement, meet the cap.
	liar := fake.GeneratedAttachment("36", "20", "2006", "liar.bin", "", 60<<20, time.Hour)
	liar["size"] = 1024
	fake.Dispatch("MESSAGE_CREATE", dmWith("2006", "small, honest", liar))
	fake.Dispatch("MESSAGE_CREATE", discordtest.Message("2007", "20", "", "5", "and after all that"))

	waitFor(t, "the message after the attachments", func() bool { return len(pending(t, c)) == 7 })
	if st := fetchState(t, c, "2004", "34"); st.State != store.AttachmentPending {
		t.Fatalf("the stalled fetch ended (%s) before the next message was admitted: admission waited on it", st.State)
	}

	for _, id := range []struct{ msg, att string }{{"2001", "31"}, {"2002", "32"}, {"2003", "33"}, {"2004", "34"}, {"2005", "35"}, {"2006", "36"}} {
		waitFor(t, "attachment "+id.att+" to settle", func() bool { return fetchState(t, c, id.msg, id.att).State != store.AttachmentPending })
	}
	want := map[string][2]string{
		"31": {store.AttachmentFetched, ""},
		"32": {store.AttachmentFetched, ""},
		"33": {store.AttachmentFailed, "too_large"},
		"34": {store.AttachmentFailed, "timeout"},
		"35": {store.AttachmentFailed, "expired"},
		"36": {store.AttachmentFailed, "too_large"},
	}
	msgs := map[string]string{"31": "2001", "32": "2002", "33": "2003", "34": "2004", "35": "2005", "36": "2006"}
	for id, w := range want {
		state, code, sha := outcome(t, c, msgs[id], id)
		if state != w[0] || code != w[1] {
			t.Errorf("attachment %s: %s %q, want %s %q", id, state, code, w[0], w[1])
		}
		if state == store.AttachmentFetched {
			p, _ := c.artifacts.Path(sha)
			got, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			wantBytes := png
			if id == "32" {
				wantBytes = []byte("refreshed bytes")
			}
			if !bytes.Equal(got, wantBytes) {
				t.Errorf("attachment %s: the artifact holds %d bytes, want the %d the CDN served", id, len(got), len(wantBytes))
			}
		}
	}
	if n, _ := fake.CDNCounts("/attachments/20/2003/huge.bin"); n != 0 {
		t.Errorf("a 60 MB attachment was requested from the CDN %d times: its announced size is past the cap", n)
	}
	if _, refreshes := fake.CDNCounts(""); refreshes < 2 {
		t.Errorf("%d refresh-urls requests, want one for each expired link", refreshes)
	}
}
