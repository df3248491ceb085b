package store

import (
	"database/sql"
	"encoding/json"
	"testing"
	"time"
)

// A step's cache misses are stored like its cache reads and writes: in the
// model_steps row and in the scratchpad record, absent stays NULL; the
// record keeps reasoning_details and what the model sent for a made-up id.
func TestRecordStepCacheMissAndReasoningDetails(t *testing.T) {
	s := newStore(t)
	ids := admitN(t, s, "default", "k1")
	var attempt int64
	mustWrite(t, s, func(tx *Tx) error {
		if err := tx.ClaimInputs("default", ids); err != nil {
			return err
		}
		frame, err := tx.TakeFrame(Frame{Session: "default", InputIDs: ids}, 0)
		if err != nil {
			return err
		}
		attempt, _, err = tx.StartAttempt(NewAttempt{Session: "default", Frame: frame, WakeReason: "input"})
		return err
	})
	miss, read := 6, 24
	var withMiss, without int64
	mustWrite(t, s, func(tx *Tx) (err error) {
		withMiss, err = tx.RecordStep(StepResult{Session: "default", Attempt: attempt, Ordinal: 1, Started: time.Now(), Route: "main",
			State: "completed", Text: "t", ReasoningDetails: json.RawMessage(`[{"type":"reasoning.encrypted","data":"x"}]`),
			Calls: []StepCall{{ID: "Ab3dE6gH9", Name: "python", Arguments: "{}", IDMadeUp: true}},
			Usage: StepUsage{CacheRead: &read, CacheMiss: &miss}})
		if err != nil {
			return err
		}
		without, err = tx.RecordStep(StepResult{Session: "default", Attempt: attempt, Ordinal: 2, Started: time.Now(), Route: "local",
			State: "completed", Text: "u", ReasoningDetails: json.RawMessage(`not json`)})
		return err
	})
	for id, want := range map[int64]sql.NullInt64{withMiss: {Int64: 6, Valid: true}, without: {}} {
		var got sql.NullInt64
		if err := s.rdb.QueryRow(`SELECT cache_miss_tokens FROM model_steps WHERE id = ?`, id).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("step %d: cache_miss_tokens %v, want %v", id, got, want)
		}
	}
	var contents []string
	rows, err := s.rdb.Query(`SELECT e.content FROM model_steps m JOIN events e ON e.id = m.response_event_id ORDER BY m.id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var c string
		rows.Scan(&c)
		contents = append(contents, c)
	}
	if len(contents) != 2 {
		t.Fatalf("records %v", contents)
	}
	var first, second map[string]any
	json.Unmarshal([]byte(contents[0]), &first)
	json.Unmarshal([]byte(contents[1]), &second)
	usage, _ := first["usage"].(map[string]any)
	calls, _ := first["tool_calls"].([]any)
	if usage["cache_miss"] != 6.0 || first["reasoning_details"] == nil || len(calls) != 1 || calls[0].(map[string]any)["id_made_up"] != true {
		t.Errorf("first record %s", contents[0])
	}
	if _, ok := second["reasoning_details"]; ok {
		t.Errorf("invalid reasoning_details recorded: %s", contents[1])
	}
}
