package store

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"
)

func newJob(t *testing.T, s *Store, j NewJob) int64 {
	t.Helper()
	if j.Kind == "" {
		j.Kind = "command"
	}
	if j.Session == "" {
		j.Session = "default"
	}
	if j.Spec == nil {
		j.Spec = json.RawMessage(`{"argv":["true"]}`)
	}
	if j.Recovery == "" {
		j.Recovery = "manual"
	}
	var id int64
	mustWrite(t, s, func(tx *Tx) (err error) { id, err = tx.InsertJob(j); return err })
	return id
}

func TestJobTransitionsAreEnforcedByTheStore(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	id := newJob(t, s, NewJob{})
	// A pending job cannot finish without running, even by hand.
	if err := s.Write(ctx, func(tx *Tx) error {
		_, err := tx.exec(`UPDATE jobs SET state = 'succeeded', finished_at = 1 WHERE id = ?`, id)
		return err
	}); err == nil {
		t.Fatal("pending → succeeded was accepted")
	}
	if err := s.Write(ctx, func(tx *Tx) error { return tx.EndJob(JobEnd{ID: id, To: JobSucceeded}) }); !errors.Is(err, ErrJobState) {
		t.Fatalf("ending a pending job: %v, want ErrJobState", err)
	}
	var run int64
	mustWrite(t, s, func(tx *Tx) (err error) { run, err = tx.StartJob(id); return err })
	if run != 1 {
		t.Fatalf("run %d, want 1", run)
	}
	if err := s.Write(ctx, func(tx *Tx) error { _, err := tx.StartJob(id); return err }); !errors.Is(err, ErrJobState) {
		t.Fatalf("starting a running job: %v, want ErrJobState", err)
	}
	mustWrite(t, s, func(tx *Tx) error {
		return tx.EndJob(JobEnd{ID: id, To: JobSucceeded, Result: json.RawMessage(`{"exit_code":0}`), Notice: "[klbr] job done"})
	})
	// Final is final: no state move and no other change.
	for _, q := range []string{`UPDATE jobs SET state = 'running' WHERE id = ?`, `UPDATE jobs SET result = '1' WHERE id = ?`} {
		if err := s.Write(ctx, func(tx *Tx) error { _, err := tx.exec(q, id); return err }); err == nil {
			t.Fatalf("%s on a finished job was accepted", q)
		}
	}
	j, err := s.Job(ctx, id)
	if err != nil || j.State != JobSucceeded || string(j.Result) != `{"exit_code":0}` || j.FinishedAt == nil {
		t.Fatalf("job %+v, %v", j, err)
	}
}

func TestJobEndCommitsOneNotification(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	id := newJob(t, s, NewJob{})
	mustWrite(t, s, func(tx *Tx) error { _, err := tx.StartJob(id); return err })
	mustWrite(t, s, func(tx *Tx) error {
		return tx.EndJob(JobEnd{ID: id, To: JobFailed, Error: "exit 1", Notice: "[klbr] job 1 failed"})
	})
	items, err := s.Inbox(ctx, "default")
	if err != nil || len(items) != 1 || items[0].SourceKind != "job" || items[0].State != InboxPending {
		t.Fatalf("inbox %+v, %v; want one pending job input", items, err)
	}
	// The notification's key is the job's run: admitting it again is a duplicate.
	mustWrite(t, s, func(tx *Tx) error {
		a, err := tx.AdmitInput(NewInput{Session: "default", SourceKind: "job", SourceKey: "job:1:1:running", Body: "again",
			OccurredAt: tx.Now(), ReceivedAt: tx.Now()})
		if err == nil && !a.Duplicate {
			t.Error("the same job run notified twice")
		}
		return err
	})
}

func TestRecurringJobRearmsAndDueOrder(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	now := time.Now()
	late := newJob(t, s, NewJob{Kind: "routine", Schedule: json.RawMessage(`{"every":60000}`), NextDue: now.Add(time.Hour)})
	early := newJob(t, s, NewJob{Kind: "routine", Schedule: json.RawMessage(`{"at":1}`), NextDue: now.Add(-time.Minute)})
	due, err := s.DueJobs(ctx, now, 10)
	if err != nil || len(due) != 1 || due[0].ID != early {
		t.Fatalf("due %+v, %v; want only job %d", due, err, early)
	}
	next, ok, _ := s.NextDue(ctx)
	if !ok || next.UnixMilli() != now.Add(-time.Minute).UnixMilli() {
		t.Fatalf("next due %v %v", next, ok)
	}
	mustWrite(t, s, func(tx *Tx) error { _, err := tx.StartJob(late); return err })
	mustWrite(t, s, func(tx *Tx) error {
		return tx.EndJob(JobEnd{ID: late, To: JobPending, Result: json.RawMessage(`1`), NextDue: now.Add(2 * time.Hour)})
	})
	j, _ := s.Job(ctx, late)
	if j.State != JobPending || j.NextDue == nil || j.Runs != 1 || j.FinishedAt != nil {
		t.Fatalf("re-armed job %+v", j)
	}
}

func TestSourceEmitDedupesAndKeepsCursor(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	id := newJob(t, s, NewJob{Kind: "source", Recovery: "resume"})
	ev := []SourceEvent{{Key: "a", Text: "one"}, {Key: "b", Text: "two"}}
	if err := s.Write(ctx, func(tx *Tx) error { _, err := tx.EmitSource(id, ev, json.RawMessage(`1`), 0); return err }); !errors.Is(err, ErrJobState) {
		t.Fatalf("emit from a pending source: %v", err)
	}
	mustWrite(t, s, func(tx *Tx) error { _, err := tx.StartJob(id); return err })
	var n int
	mustWrite(t, s, func(tx *Tx) (err error) {
		n, err = tx.EmitSource(id, ev, json.RawMessage(`{"after":"b"}`), 0)
		return err
	})
	if n != 2 {
		t.Fatalf("admitted %d, want 2", n)
	}
	mustWrite(t, s, func(tx *Tx) (err error) {
		n, err = tx.EmitSource(id, append(ev, SourceEvent{Key: "c", Text: "three"}), json.RawMessage(`{"after":"c"}`), 0)
		return err
	})
	if n != 1 {
		t.Fatalf("admitted %d on the second emit, want 1 (a and b are duplicates)", n)
	}
	j, _ := s.Job(ctx, id)
	if string(j.Cursor) != `{"after":"c"}` {
		t.Fatalf("cursor %s", j.Cursor)
	}
	items, _ := s.Inbox(ctx, "default")
	if len(items) != 3 || items[0].SourceKind != "source" {
		t.Fatalf("inbox %+v", items)
	}
	// Bounded: with 3 pending, a bound of 4 refuses two more, and nothing of them (nor the cursor) is kept.
	err := s.Write(ctx, func(tx *Tx) error {
		_, err := tx.EmitSource(id, []SourceEvent{{Key: "d"}, {Key: "e"}}, json.RawMessage(`{"after":"e"}`), 4)
		return err
	})
	if !errors.Is(err, ErrSourceBacklog) {
		t.Fatalf("emit past the backlog bound: %v", err)
	}
	if j, _ := s.Job(ctx, id); string(j.Cursor) != `{"after":"c"}` {
		t.Fatalf("a refused emit moved the cursor to %s", j.Cursor)
	}
}
