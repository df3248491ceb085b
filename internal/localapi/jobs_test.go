package localapi

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"testing"

	"github.com/klbr-dev/klbr/internal/localclient"
	"github.com/klbr-dev/klbr/internal/store"
)

func TestJobsAreListedAndRead(t *testing.T) {
	h := start(t)
	ctx := context.Background()
	var id int64
	if err := h.st.Write(ctx, func(tx *store.Tx) (err error) {
		id, err = tx.InsertJob(store.NewJob{Kind: "command", Session: "default", Spec: json.RawMessage(`{"argv":["make"]}`), Recovery: "manual"})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	list, err := h.client.Jobs(ctx, "default", "pending", 10)
	if err != nil || len(list.Jobs) != 1 || list.Jobs[0].ID != id || string(list.Jobs[0].Spec) != `{"argv":["make"]}` {
		t.Fatalf("list %+v, %v", list, err)
	}
	if list, _ := h.client.Jobs(ctx, "", "running", 0); len(list.Jobs) != 0 {
		t.Fatalf("running jobs %+v, want none", list.Jobs)
	}
	j, err := h.client.Job(ctx, id)
	if err != nil || j.State != store.JobPending {
		t.Fatalf("job %+v, %v", j, err)
	}
	var e *localclient.Error
	if _, err := h.client.Job(ctx, 999); !errors.As(err, &e) || e.Status != http.StatusNotFound {
		t.Fatalf("unknown job: %v", err)
	}
	if _, err := h.client.Jobs(ctx, "", "bogus", 0); !errors.As(err, &e) || e.Status != http.StatusBadRequest {
		t.Fatalf("bad state: %v", err)
	}
	if _, err := h.client.Jobs(ctx, "nosuch", "", 0); !errors.As(err, &e) || e.Status != http.StatusNotFound {
		t.Fatalf("unknown session: %v", err)
	}
	// Without jobs running in this daemon, cancel says so and changes nothing.
	if _, err := h.client.CancelJob(ctx, id); !errors.As(err, &e) || e.Status != http.StatusServiceUnavailable {
		t.Fatalf("cancel: %v", err)
	}
}
