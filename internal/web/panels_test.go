package web

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/klbr-dev/klbr/internal/history"
	"github.com/klbr-dev/klbr/internal/store"
)

func FuzzDecodeMark(f *testing.F) {
	for _, s := range []string{`{"status":"acted"}`, `{"status":"pending","note":"reopened"}`, `{"status":"x"}`, `[]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeMark(b)
		if err != nil {
			if !errors.Is(err, ErrBadMessage) {
				t.Fatalf("error %v does not wrap ErrBadMessage", err)
			}
			return
		}
		if len(b) > MaxMarkBody || len(m.Note) > 1000 {
			t.Fatalf("accepted an oversized mark: %d bytes", len(b))
		}
		switch m.Status {
		case "pending", "seen", "acted", "ignored":
		default:
			t.Fatalf("accepted status %q", m.Status)
		}
		_ = utf8.ValidString(m.Note)
	})
}

// admitDiscord admits a Discord message as the ingress does.
func (h *harness) admitDiscord(t *testing.T, msgID, ch, kind, mode, text string) store.DiscordAdmitted {
	t.Helper()
	var d store.DiscordAdmitted
	if err := h.st.Write(context.Background(), func(tx *store.Tx) error {
		now := tx.Now()
		a, err := tx.AdmitInput(store.NewInput{Session: "default", SourceKind: "discord", SourceKey: "discord:" + msgID,
			Conversation: store.ConversationKey(ch), Author: "u1", Directed: mode != "ambient", OccurredAt: now, ReceivedAt: now, Body: text})
		if err != nil {
			return err
		}
		d, err = tx.RecordDiscordMessage(a, store.DiscordMessage{Session: "default", MessageID: msgID, ChannelID: ch, ChannelKind: kind,
			ChannelName: "general", AuthorID: "u1", Mode: mode})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return d
}

func (h *harness) do(t *testing.T, method, path string, hdr http.Header, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, h.http.URL+path, strings.NewReader(body))
	req.Header.Set("Cookie", CookieName+"="+testToken)
	for k, v := range hdr {
		req.Header[k] = v
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

func TestDiscordPanelAndMarks(t *testing.T) {
	h := startWith(t, func(h *harness, b *Browser) { b.History = &history.Reader{Store: h.st} })
	dm := h.admitDiscord(t, "900", "950", "dm", "dm", "are you there?")
	h.admitDiscord(t, "901", "951", "channel", "ambient", "lunch?")

	code, body := h.do(t, "GET", "/v2/discord", nil, "")
	var v discordView
	if code != 200 || json.Unmarshal([]byte(body), &v) != nil {
		t.Fatalf("GET /v2/discord: %d %s", code, body)
	}
	if len(v.Conversations) != 2 || v.Conversations[0].Pending != 1 || v.Conversations[1].Pending != 0 || len(v.Items) != 1 ||
		v.Conversations[0].Messages != 1 || v.Conversations[0].LastInput == 0 ||
		v.Items[0].Status != "pending" {
		t.Fatalf("view %+v: want the DM with one pending item and the channel with none", v)
	}
	code, body = h.do(t, "GET", "/v2/discord/"+dm.Conversation, nil, "")
	var cv conversationView
	if code != 200 || json.Unmarshal([]byte(body), &cv) != nil || len(cv.Messages) != 1 || cv.Messages[0].Mode != "dm" ||
		!strings.Contains(string(cv.Messages[0].Content), "are you there?") {
		t.Fatalf("GET the DM: %d %s", code, body)
	}
	if code, _ := h.do(t, "GET", "/v2/discord/d77", nil, ""); code != 404 {
		t.Errorf("unknown conversation: %d, want 404", code)
	}

	origin := "http://" + strings.TrimPrefix(h.http.URL, "http://")
	js := http.Header{"Content-Type": {"application/json"}, "Origin": {origin}}
	path := "/v2/items/" + itoa(int(dm.ItemID)) + "/mark"
	// No Origin (a form from nowhere), a foreign one, or not JSON: refused.
	if code, _ := h.do(t, "POST", path, http.Header{"Content-Type": {"application/json"}}, `{"status":"ignored"}`); code != 403 {
		t.Errorf("mark without Origin: %d, want 403", code)
	}
	if code, _ := h.do(t, "POST", path, http.Header{"Content-Type": {"application/json"}, "Origin": {"http://127.0.0.1:1"}}, `{"status":"ignored"}`); code != 403 {
		t.Errorf("mark from another origin: %d, want 403", code)
	}
	if code, _ := h.do(t, "POST", path, http.Header{"Content-Type": {"text/plain"}, "Origin": {origin}}, `{"status":"ignored"}`); code != 415 {
		t.Errorf("mark as text/plain: %d, want 415", code)
	}
	code, body = h.do(t, "POST", path, js, `{"status":"ignored","note":"spam"}`)
	var it store.AttentionItem
	if code != 200 || json.Unmarshal([]byte(body), &it) != nil || it.Status != "ignored" || it.DecisionOrigin != "operator" {
		t.Fatalf("mark ignored: %d %s", code, body)
	}
	if code, _ := h.do(t, "POST", path, js, `{"status":"acted"}`); code != 409 {
		t.Errorf("ignored → acted without a reopen: %d, want 409", code)
	}
	if code, body := h.do(t, "POST", path, js, `{"status":"pending"}`); code != 200 || !strings.Contains(body, `"pending"`) {
		t.Errorf("reopen: %d %s", code, body)
	}
	if code, _ := h.do(t, "POST", "/v2/items/999/mark", js, `{"status":"seen"}`); code != 404 {
		t.Errorf("unknown item: %d, want 404", code)
	}

	code, body = h.do(t, "GET", "/v2/releases", nil, "")
	if code != 200 || !strings.Contains(body, `"last_good":null`) {
		t.Errorf("releases: %d %s", code, body)
	}
	code, body = h.do(t, "GET", "/v2/history?q=lunch", nil, "")
	if code != 200 || !strings.Contains(body, "lunch") {
		t.Errorf("history search: %d %s", code, body)
	}
	// Every panel endpoint needs the token.
	for _, p := range []string{"/v2/discord", "/v2/discord/d1", "/v2/releases", "/v2/history?q=x"} {
		if res := h.get(t, p, false); res.StatusCode != 401 {
			t.Errorf("%s without token: %d", p, res.StatusCode)
		}
	}
}
