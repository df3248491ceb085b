package web

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"unicode/utf8"

	"github.com/klbr-dev/klbr/internal/store"
)

// FuzzDecodeDecide: a held effect's decision body is outside input; the
// decoder never panics, refuses what is past its bounds with ErrBadMessage,
// and what it accepts is a bounded UTF-8 note.
func FuzzDecodeDecide(f *testing.F) {
	for _, s := range []string{`{}`, `{"note":"checked"}`, `{"note":1}`, `{"note":"x","extra":true}`, `{} {}`, `[]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		note, err := decodeDecide(b)
		if err != nil {
			if !errors.Is(err, ErrBadMessage) {
				t.Fatalf("error %v does not wrap ErrBadMessage", err)
			}
			return
		}
		if len(b) > MaxDecideBody || len(note) > maxDecideNote || !utf8.ValidString(note) {
			t.Fatalf("accepted %q from %d bytes", note, len(b))
		}
	})
}

// The held-send endpoints: listed; decided only from the page's own origin,
// as JSON; released once (the transport is woken) or dropped, in the
// operator's name; a second decision or an unknown effect is refused.
func TestHeldPanelReleasesOnceFromThePage(t *testing.T) {
	var kicks atomic.Int32
	h := startWith(t, func(h *harness, b *Browser) { b.Outbox = func() { kicks.Add(1) } })
	dm := h.admitDiscord(t, "910", "960", "dm", "dm", "what's the password?")
	ctx := context.Background()
	conv, err := h.st.ConversationByRef(ctx, dm.Conversation)
	if err != nil {
		t.Fatal(err)
	}
	var held [2]store.Effect
	for i := range held {
		if err := h.st.Write(ctx, func(tx *store.Tx) (err error) {
			held[i], err = tx.EnqueueEffect(store.NewEffect{Session: "default", Kind: store.EffectSend, ConversationID: conv.ID,
				IdempotencyKey: "x1/" + itoa(i), Nonce: "kh" + itoa(i), Text: "a password", Held: true, Reason: "held by delivery.review: a password"})
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	code, body := h.do(t, "GET", "/v2/held", nil, "")
	var v heldView
	if code != 200 || json.Unmarshal([]byte(body), &v) != nil || len(v.Effects) != 2 || v.Effects[0].HeldReason == "" {
		t.Fatalf("GET /v2/held: %d %s", code, body)
	}
	origin := "http://" + strings.TrimPrefix(h.http.URL, "http://")
	js := http.Header{"Content-Type": {"application/json"}, "Origin": {origin}}
	release := "/v2/held/" + itoa(int(held[0].ID)) + "/release"
	for name, hdr := range map[string]http.Header{
		"no Origin":      {"Content-Type": {"application/json"}},
		"another Origin": {"Content-Type": {"application/json"}, "Origin": {"http://127.0.0.1:1"}},
	} {
		if code, _ := h.do(t, "POST", release, hdr, `{}`); code != 403 {
			t.Errorf("release with %s: %d, want 403", name, code)
		}
	}
	if code, _ := h.do(t, "POST", release, http.Header{"Content-Type": {"text/plain"}, "Origin": {origin}}, `{}`); code != 415 {
		t.Errorf("release as text/plain: %d, want 415", code)
	}
	if code, _ := h.do(t, "POST", release, js, `{"note":1}`); code != 400 {
		t.Errorf("a malformed body: %d, want 400", code)
	}
	if kicks.Load() != 0 {
		t.Fatal("a refused release woke the transport")
	}
	code, body = h.do(t, "POST", release, js, `{"note":"checked"}`)
	var e store.Effect
	if code != 200 || json.Unmarshal([]byte(body), &e) != nil || e.State != store.EffectPending || e.ReleasedBy != "the operator (browser): checked" {
		t.Fatalf("release: %d %s", code, body)
	}
	if kicks.Load() != 1 {
		t.Errorf("the release woke the transport %d times, want once", kicks.Load())
	}
	if code, _ := h.do(t, "POST", release, js, `{}`); code != 409 {
		t.Errorf("a second release: %d, want 409", code)
	}
	if code, body := h.do(t, "POST", "/v2/held/"+itoa(int(held[1].ID))+"/drop", js, `{}`); code != 200 || !strings.Contains(body, `"error_code":"dropped"`) {
		t.Errorf("drop: %d %s", code, body)
	}
	if code, _ := h.do(t, "POST", "/v2/held/999/drop", js, `{}`); code != 404 {
		t.Errorf("an unknown effect: %d, want 404", code)
	}
	if code, body := h.do(t, "GET", "/v2/held", nil, ""); code != 200 || !strings.Contains(body, `"effects":[]`) {
		t.Errorf("after the decisions: %d %s", code, body)
	}
}
