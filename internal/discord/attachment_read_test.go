package discord

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/discordtest"
	"github.com/klbr-dev/klbr/internal/ingress"
	"github.com/klbr-dev/klbr/internal/session"
	"github.com/klbr-dev/klbr/internal/workbench"
	"github.com/klbr-dev/klbr/internal/worker"
)

func readAttachment(ops *ingress.Ops, session string, args map[string]any) (ingress.AttachmentChunk, error) {
	raw, _ := json.Marshal(args)
	ctx := workbench.WithSession(context.Background(), session)
	out, err := ops.HandleRequest(ctx, worker.Request{Op: "discord.attachment", Args: raw})
	var c ingress.AttachmentChunk
	if err == nil {
		err = json.Unmarshal(out, &c)
	}
	return c, err
}

func refusal(err error) string {
	var re *worker.RequestError
	if errors.As(err, &re) {
		return re.Code
	}
	if err == nil {
		return "<nil>"
	}
	return "error: " + err.Error()
}

// A cell reads an attachment of a message its session was shown, in
// bounded chunks, by the message and attachment ids it was given: never by
// an artifact digest or a path, never another session's, and a fetch that
// failed or is still under way says so.
func TestACellReadsTheAttachmentsItWasShown(t *testing.T) {
	c := startCore(t, t.TempDir())
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
	runTransportWith(t, fake, c.socket, func(cfg *Config) { cfg.Fetch.Timeout = 20 * time.Second })

	log := bytes.Repeat([]byte("line of a build log <&>\n"), 30000) // 720 kB: three chunks
	fake.Dispatch("MESSAGE_CREATE", dmWith("2101", "the log", fake.Attachment("41", "20", "2101", "build.log", "text/plain", log, time.Hour)))
	fake.Dispatch("MESSAGE_CREATE", dmWith("2102", "huge", fake.AttachmentOfSize("42", "20", "2102", "huge.bin", "", []byte("x"), 60<<20)))
	fake.Dispatch("MESSAGE_CREATE", dmWith("2103", "slow", fake.Attachment("43", "20", "2103", "stall.txt", "text/plain", []byte("never"), time.Hour)))
	waitFor(t, "the three messages", func() bool { return len(pending(t, c)) == 3 })

	ops := ingress.NewOps(c.store, nil, c.server)
	ops.AttachmentWait = 10 * time.Second
	var got []byte
	for off := 0; ; {
		ch, err := readAttachment(ops, session.DefaultID, map[string]any{"message_id": "2101", "attachment_id": "41", "offset": off})
		if err != nil {
			t.Fatalf("reading the log at %d: %v", off, err)
		}
		if len(ch.Data) > ingress.MaxAttachmentChunk || ch.Size != int64(len(log)) || ch.Filename != "build.log" || ch.ContentType != "text/plain" {
			t.Fatalf("chunk at %d: %d bytes of %d, %q %q", off, len(ch.Data), ch.Size, ch.Filename, ch.ContentType)
		}
		got = append(got, ch.Data...)
		off += len(ch.Data)
		if ch.EOF {
			break
		}
	}
	if !bytes.Equal(got, log) {
		t.Fatalf("the cell read %d bytes, not the %d the CDN served", len(got), len(log))
	}

	ops.AttachmentWait = 500 * time.Millisecond
	cases := []struct {
		name    string
		session string
		args    map[string]any
		code    string
	}{
		{"another session's message", "child-1", map[string]any{"message_id": "2101", "attachment_id": "41"}, "not_found"},
		{"an attachment of another message", session.DefaultID, map[string]any{"message_id": "2102", "attachment_id": "41"}, "not_found"},
		{"an artifact digest", session.DefaultID, map[string]any{"message_id": "2101", "attachment_id": "41", "sha256": strings.Repeat("a", 64)}, "invalid"},
		{"a path", session.DefaultID, map[string]any{"message_id": "2101", "attachment_id": "../../runtime.sqlite"}, "invalid"},
		{"a chunk past the bound", session.DefaultID, map[string]any{"message_id": "2101", "attachment_id": "41", "length": ingress.MaxAttachmentChunk + 1}, "invalid"},
		{"a negative offset", session.DefaultID, map[string]any{"message_id": "2101", "attachment_id": "41", "offset": -1}, "invalid"},
		{"an offset past the end", session.DefaultID, map[string]any{"message_id": "2101", "attachment_id": "41", "offset": len(log) + 1}, "invalid"},
		{"one too large to fetch", session.DefaultID, map[string]any{"message_id": "2102", "attachment_id": "42"}, "unavailable"},
		{"one still being fetched", session.DefaultID, map[string]any{"message_id": "2103", "attachment_id": "43"}, "pending"},
	}
	waitFor(t, "the huge one's failure", func() bool { return fetchState(t, c, "2102", "42").State != "pending" })
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := readAttachment(ops, tc.session, tc.args)
			if refusal(err) != tc.code {
				t.Fatalf("%v: refused %q, want %q", err, refusal(err), tc.code)
			}
		})
	}
	_, err := readAttachment(ops, session.DefaultID, map[string]any{"message_id": "2102", "attachment_id": "42"})
	if !strings.Contains(err.Error(), "too_large") {
		t.Errorf("the failed fetch's refusal does not say why: %v", err)
	}
}
