package provider

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/klbr-dev/klbr/internal/config"
)

// A seed default route carries no model name: the request leaves "model"
// out, and the server answers with the one it serves.
func TestSeedRouteSendsNoModel(t *testing.T) {
	f := newFake(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		io.WriteString(w, `{"choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}`)
	})
	r := config.Route{URL: f.srv.URL + "/v1", TimeoutSeconds: 30, Seed: "start a server"}
	if _, err := newClient(t, r, nil).Complete(context.Background(), Request{Messages: userMsg("hi")}); err != nil {
		t.Fatal(err)
	}
	if m, ok := f.lastBody(t)["model"]; ok {
		t.Fatalf("the request carries model %v", m)
	}
	if _, err := New(config.Route{URL: f.srv.URL + "/v1"}, Options{}); err == nil {
		t.Fatal("a configured route without a model was built")
	}
}

// When nothing answers at a seed default, the error says what to start or
// configure; it stays a retryable network error.
func TestSeedRouteNothingAnswers(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	r := config.Route{URL: "http://" + addr + "/v1", TimeoutSeconds: 30, Seed: "start an OpenAI-compatible server there, or configure [routes.main]"}
	_, err = newClient(t, r, nil).Complete(context.Background(), Request{Messages: userMsg("hi")})
	var pe *Error
	if !errors.As(err, &pe) || pe.Kind != KindNetwork || !pe.Retryable() || !strings.Contains(err.Error(), "start an OpenAI-compatible server there, or configure [routes.main]") {
		t.Fatalf("err = %v, want a retryable network error saying what to start", err)
	}
}
