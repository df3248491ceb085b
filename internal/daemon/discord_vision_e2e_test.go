package daemon

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/discordtest"
	"github.com/klbr-dev/klbr/internal/modeltest"
)

// startVisionAgent is startAgent with [routes.main] vision = true.
func startVisionAgent(t *testing.T, model *modeltest.Server) *agent {
	t.Helper()
	requirePython(t)
	data, env := instance(t)
	conf := filepath.Join(data, "klbr.toml")
	body := fmt.Sprintf("[agent]\nroute = \"main\"\nretry_backoff_ms = 50\n[routes.main]\nurl = %q\nmodel = \"fake\"\ntimeout_seconds = 30\nvision = true\n", model.URL())
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	env = append(env, "PATH="+kernelDir(t)+":"+os.Getenv("PATH"), "KLBR_CONFIG="+conf)
	a := &agent{t: t, model: model, data: data, env: env}
	a.start()
	return a
}

// imageParts are the image_url parts of a request's user messages.
func imageParts(msgs []map[string]any) (urls []string, text string) {
	for _, m := range msgs {
		parts, ok := m["content"].([]any)
		if !ok || m["role"] != "user" {
			continue
		}
		for _, p := range parts {
			p, _ := p.(map[string]any)
			switch p["type"] {
			case "text":
				s, _ := p["text"].(string)
				text += s
			case "image_url":
				iu, _ := p["image_url"].(map[string]any)
				u, _ := iu["url"].(string)
				urls = append(urls, u)
			}
		}
	}
	return urls, text
}

// An image posted in a DM reaches a vision = true route as an image part of
// its user message (an OpenAI data URL), even though its fetch ends after
// the message was admitted; at most MaxImagesPerRequest go with one request,
// and what is not an image (or does not sniff as one) goes as its
// description only.
func TestAnImageInADMReachesAVisionRoute(t *testing.T) {
	model := modeltest.New()
	defer model.Close()
	model.Otherwise(func(int) modeltest.Reply {
		return modeltest.Reply{Calls: []modeltest.Call{{Code: "await runtime.wait(None)"}}}
	})
	a := startVisionAgent(t, model)
	fake := discordtest.New("99")
	defer fake.Close()
	startTransport(t, fake, a.data)
	a.eventually("the gateway session", fake.Connected)

	png := func(i int) []byte { return append([]byte("\x89PNG\r\n\x1a\n"), bytes.Repeat([]byte{byte(i)}, 4000)...) }
	m := discordtest.Message("8501", "85", "", "5", "which of these is broken?")
	// First an "image" whose bytes are not one: it goes as its description.
	atts := []any{fake.Attachment("8520", "85", "8501", "fake.png", "image/png", []byte("not a png at all"), time.Hour)}
	for i := 1; i <= 5; i++ {
		atts = append(atts, fake.Attachment(fmt.Sprint(8510+i), "85", "8501", fmt.Sprintf("shot%d.png", i), "image/png", png(i), time.Hour))
	}
	atts = append(atts, fake.Attachment("8521", "85", "8501", "notes.txt", "text/plain", []byte("hello"), time.Hour))
	m["attachments"] = atts
	fake.Dispatch("MESSAGE_CREATE", m)
	a.eventually("a model request", func() bool { return len(model.Requests()) > 0 })

	urls, text := imageParts(model.Requests()[0].Messages)
	if len(urls) != 4 {
		t.Fatalf("the first request carried %d images, want 4 (the per-request bound)", len(urls))
	}
	for i, u := range urls {
		if want := "data:image/png;base64," + base64.StdEncoding.EncodeToString(png(i+1)); u != want {
			t.Errorf("image %d: %.60s…, want the bytes of shot%d.png", i, u, i+1)
		}
	}
	if !strings.Contains(text, "which of these is broken?") || !strings.Contains(text, `[attachment a7: "notes.txt"`) {
		t.Errorf("the text part lost the message or its attachment lines: %q", text)
	}
}
