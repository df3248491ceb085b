package localapi

import (
	"context"
	"errors"
	"net/http"
	"testing"

	"github.com/klbr-dev/klbr/internal/localclient"
)

// GET /v1/sessions/{id}/usage answers a session's recorded usage; an
// unknown session is 404.
func TestUsageOfASession(t *testing.T) {
	h := start(t)
	ctx := context.Background()
	u, err := h.client.Usage(ctx, "default")
	if err != nil || u.Session != "default" || u.ModelRequests != 0 || u.Tokens != 0 {
		t.Fatalf("usage %+v, %v", u, err)
	}
	var e *localclient.Error
	if _, err := h.client.Usage(ctx, "nobody"); !errors.As(err, &e) || e.Status != http.StatusNotFound {
		t.Fatalf("an unknown session's usage: %v", err)
	}
}
