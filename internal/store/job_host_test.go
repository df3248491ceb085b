package store

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
)

// A running job's host is recorded and read back; a job that is not
// running cannot be placed.
func TestPlaceJob(t *testing.T) {
	ctx := context.Background()
	st, err := Open(ctx, t.TempDir(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var id int64
	if err := st.Write(ctx, func(tx *Tx) (err error) {
		if _, err = tx.EnsureSession("default"); err != nil {
			return err
		}
		id, err = tx.InsertJob(NewJob{Kind: "command", Session: "default", Spec: json.RawMessage(`{"argv":["true"],"host":"label:gpu"}`), Recovery: "manual"})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := st.Write(ctx, func(tx *Tx) error { return tx.PlaceJob(id, "gpu") }); !errors.Is(err, ErrJobState) {
		t.Fatalf("placing a pending job: %v", err)
	}
	if err := st.Write(ctx, func(tx *Tx) error {
		if _, err := tx.StartJob(id); err != nil {
			return err
		}
		return tx.PlaceJob(id, "gpu")
	}); err != nil {
		t.Fatal(err)
	}
	if j, err := st.Job(ctx, id); err != nil || j.Host != "gpu" {
		t.Fatalf("job %+v, %v", j, err)
	}
}
