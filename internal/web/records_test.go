package web

import (
	"context"
	"database/sql"
	"encoding/json"
	"path/filepath"
	"testing"
	"time"

	_ "github.com/mattn/go-sqlite3" // registers "sqlite3" for rawRecords

	"github.com/klbr-dev/klbr/internal/store"
)

// rawRecord is a durable record of any lane and kind.
type rawRecord struct {
	lane    store.Lane
	kind    string
	content any
}

// rawRecords appends records to the default session in one transaction,
// with SQL on a second connection to the store's file: the page must render
// every kind the turn loop writes (and kinds it does not know), whether or
// not a store function writes it yet. Watchers are not woken: the next
// commit through the store (or a reconnect) brings the records.
func (h *harness) rawRecords(t testing.TB, recs ...rawRecord) {
	t.Helper()
	db, err := sql.Open("sqlite3", "file:"+filepath.Join(h.dir, store.FileName)+"?_busy_timeout=10000&_txlock=immediate")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	tx, err := db.BeginTx(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	now := time.Now().UnixMilli()
	for _, r := range recs {
		b, err := json.Marshal(r.content)
		if err != nil {
			t.Fatal(err)
		}
		res, err := tx.Exec(`INSERT INTO events (session_id, kind, content, occurred_at, received_at) VALUES ('default', ?, ?, ?, ?)`, r.kind, string(b), now, now)
		if err != nil {
			t.Fatal(err)
		}
		id, _ := res.LastInsertId()
		if _, err := tx.Exec(`INSERT INTO session_items (session_id, event_id, lane, at) VALUES ('default', ?, ?, ?)`, id, r.lane, now); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
}

// nudge commits a kernel.started notice through the store, which wakes the
// sockets: they read everything after their cursor, raw records included.
func (h *harness) nudge(t testing.TB) {
	t.Helper()
	if err := h.st.Write(context.Background(), func(tx *store.Tx) error {
		_, err := tx.NextKernelGeneration("default", nil)
		return err
	}); err != nil {
		t.Fatal(err)
	}
}

// turnRecords is one turn of every kind the turn loop writes, in the order
// it would, plus kinds the page does not know.
func turnRecords(deadline time.Time) []rawRecord {
	code1 := "import json, pathlib\n# read the notes\nnotes = pathlib.Path('notes.md').read_text()\nprint(len(notes))"
	code2 := "from klbr import local\nawait local.send(\"Done: the notes have 1234 characters.\")"
	args := func(code string) string { b, _ := json.Marshal(map[string]string{"code": code}); return string(b) }
	long := ""
	for i := range 30 {
		long += "line " + itoa(i) + " of a long output\n"
	}
	return []rawRecord{
		{store.LaneInput, "discord.input", map[string]any{"text": "how long are my notes?", "source_kind": "discord", "source_key": "m1",
			"conversation": "d1", "author": "ada"}},
		{store.LaneScratchpad, "scratchpad", map[string]any{"attempt": 7, "step": 1, "route": "main",
			"text":      "The user asks about the notes. I will read the file, then answer with local.send.",
			"reasoning": "Plan: read, count, send.", "reasoning_field": "reasoning_content",
			"tool_calls": []map[string]any{{"id": "call_a", "name": "python", "arguments": args(code1)}},
			"partial":    false, "finish_reason": "tool_calls",
			"usage": map[string]any{"prompt": 1200, "completion": 80, "cache_read": 1024}}},
		{store.LaneCell, "cell.started", map[string]any{"code": code1, "generation": 1, "behavior_epoch": 1, "release": "r1", "tool_call_id": "call_a", "step": 1}},
		{store.LaneCell, "cell.finished", map[string]any{"status": "ok", "execution_id": 1, "tool_call_id": "call_a", "generation": 1,
			"output": map[string]any{"preview": []map[string]string{{"stream": "stdout", "origin": "execution", "data": long}}}, "value": nil}},
		{store.LaneScratchpad, "scratchpad", map[string]any{"attempt": 7, "step": 2, "route": "main", "text": "",
			"tool_calls": []map[string]any{{"id": "call_b", "name": "python", "arguments": args(code2)}}, "finish_reason": "tool_calls"}},
		{store.LaneCell, "cell.started", map[string]any{"code": code2, "generation": 1, "behavior_epoch": 1, "release": "r1", "tool_call_id": "call_b", "step": 2}},
		{store.LaneSpeech, "local.sent", map[string]any{"text": "Done: the notes have 1234 characters.", "behavior_epoch": 1, "status": "confirmed"}},
		{store.LaneCell, "cell.finished", map[string]any{"status": "error", "execution_id": 2, "tool_call_id": "call_b", "generation": 1,
			"error": map[string]any{"type": "NameError", "message": "name 'x' is not defined"}}},
		{store.LaneCell, "tool.unrun", map[string]any{"tool_call_id": "call_c", "step": 2, "state": "skipped", "message": "an earlier call of the group waited"}},
		{store.LaneNotice, "delivery.reminder", map[string]any{"attempt": 7, "frame": 3, "text": "ada asked you something in d1 and has no answer yet"}},
		{store.LaneNotice, "wait.started", map[string]any{"attempt": 7, "seconds": 30, "deadline": deadline.UnixMilli(), "reason": "give ada time to answer"}},
		{store.LaneNotice, "wait.woken", map[string]any{"by": "input", "reason": "an operator input", "waited_ms": 4200}},
		{store.LaneNotice, "model.error", map[string]any{"attempt": 8, "step": 1, "kind": "http_status", "message": "502 from the route", "retry_in_ms": 2000}},
		{store.LaneScratchpad, "scratchpad", map[string]any{"attempt": 8, "step": 2, "route": "main", "text": "I was about to say that the",
			"partial": true, "finish_reason": ""}},
		{store.LaneNotice, "turn.idle", map[string]any{"attempt": 8, "reason": "nothing to do"}},
		{store.LaneNotice, "context.reset", map[string]any{"epoch": 2, "reason": "reset by operator"}},
		{store.LaneNotice, "context.budget", map[string]any{"needed": 140000, "budget": 128000}},
		{store.LaneNotice, "turn.paused", map[string]any{"attempt": 9, "reason": "step budget: 40 model requests in this attempt"}},
		{store.LaneSpeech, "discord.sent", map[string]any{"effect_id": 1, "kind": "send", "state": "confirmed", "conversation": "d1",
			"text": "Your notes have 1234 characters.", "reply_reference": true, "message_id": "99"}},
		{store.LaneSpeech, "discord.failed", map[string]any{"effect_id": 2, "kind": "send", "state": "failed", "conversation": "d2",
			"text": "hello d2", "error_code": "50013", "error": "Missing Permissions"}},
		{store.LaneSpeech, "discord.unknown", map[string]any{"effect_id": 3, "kind": "send", "state": "unknown", "conversation": "d1",
			"text": "did this arrive?", "evidence": "no echo and no message in history"}},
		{store.LaneSpeech, "discord.react.confirmed", map[string]any{"effect_id": 4, "kind": "react", "state": "confirmed", "conversation": "d1",
			"emoji": "👍", "target_message_id": "m1"}},
		{store.LaneNotice, "turn.resumed", map[string]any{"reason": "restart"}},
		{store.LaneNotice, "mystery.notice", map[string]any{"what": "a kind from the future"}},
		{store.LaneCell, "cell.mystery", map[string]any{"text": "an unknown cell record"}},
	}
}
