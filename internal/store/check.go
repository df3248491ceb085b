package store

import (
	"context"
	"fmt"
	"strings"
)

// Finding is one thing a consistency check found, with what to do.
type Finding struct {
	Check   string `json:"check"`   // integrity, foreign_keys, inbox, outbox, attention, attempts, coverage, releases, artifacts, …
	Subject string `json:"subject"` // what it is about: a table row, a file
	Problem string `json:"problem"`
	Fix     string `json:"fix"`
	// Harmless is a leftover that takes space and nothing else (a file no
	// record names): the directory is still clean.
	Harmless bool `json:"harmless,omitempty"`
}

func (f Finding) String() string {
	s := f.Check + ": "
	if f.Subject != "" {
		s += f.Subject + ": "
	}
	return s + f.Problem + "; " + f.Fix
}

const restoreFix = "restore the newest backup whose check is clean (klbr-core restore), or keep this copy aside and report it"

// invariants are the state machines' rules the schema cannot say by
// itself (a row written past the triggers, by hand or by a bug): each
// query lists the rows that break one.
var invariants = []struct {
	check, rule, query, fix string
}{
	{"inbox", "a consumed input's frame belongs to another session",
		`SELECT 'input ' || b.input_id FROM inbox b JOIN attention_frames f ON f.id = b.frame_id WHERE f.session_id <> b.session_id`, restoreFix},
	{"inbox", "an inbox row is in another session than its input",
		`SELECT 'input ' || b.input_id FROM inbox b JOIN inputs i ON i.id = b.input_id WHERE i.session_id <> b.session_id`, restoreFix},
	{"outbox", "a confirmed send has no Discord message id",
		`SELECT 'effect ' || id FROM discord_outbox WHERE state = 'confirmed' AND kind = 'send' AND message_id = ''`,
		"nothing proves it was delivered: mark it unknown by hand only with evidence, else " + restoreFix},
	{"outbox", "an effect moved past pending without a claim by the transport",
		`SELECT 'effect ' || id || ' (' || state || ')' FROM discord_outbox WHERE state IN ('attempting', 'confirmed', 'unknown') AND (claimed_at IS NULL OR attempts < 1)`,
		"its state was not reached through an attempt; " + restoreFix},
	{"attention", "an item moved past pending without a decision",
		`SELECT 'item ' || a.id || ' (' || a.status || ')' FROM attention_items a WHERE a.status <> 'pending'
		   AND NOT EXISTS (SELECT 1 FROM attention_decisions d WHERE d.item_id = a.id)`,
		"its status has no evidence; reopen it (klbr-core mark) or " + restoreFix},
	{"attention", "a consumed reply anchor whose send is not confirmed",
		`SELECT 'item ' || a.id FROM attention_items a JOIN discord_outbox o ON o.id = a.anchor_effect
		   WHERE a.anchor_consumed = 1 AND o.state <> 'confirmed'`, restoreFix},
	{"attempts", "a session has more than one running attempt",
		`SELECT 'session ' || session_id FROM attempts WHERE state = 'running' GROUP BY session_id HAVING count(*) > 1`,
		"stop klbr-core and start it again: it records the older attempt as interrupted"},
	{"jobs", "a running job has no start time",
		`SELECT 'job ' || id FROM jobs WHERE state = 'running' AND started_at IS NULL`,
		"it did not start through the scheduler; cancel it (klbr-core jobs cancel) or " + restoreFix},
	{"jobs", "a pending job has no deadline: it never runs",
		`SELECT 'job ' || id FROM jobs WHERE state = 'pending' AND next_due IS NULL`,
		"cancel it (klbr-core jobs cancel) and schedule it again, or " + restoreFix},
	{"jobs", "a job succeeded or failed without ever running",
		`SELECT 'job ' || id || ' (' || state || ')' FROM jobs WHERE state IN ('succeeded', 'failed') AND runs = 0`,
		"its outcome has no run behind it; " + restoreFix},
	{"history", "a collected record has no normal summary covering it wholly",
		`SELECT 'e' || e.id FROM events e WHERE e.collected_at IS NOT NULL AND (
		   NOT EXISTS (SELECT 1 FROM context_items c WHERE c.event_id = e.id)
		   OR EXISTS (SELECT 1 FROM context_items c WHERE c.event_id = e.id AND NOT EXISTS (
		     SELECT 1 FROM summary_children k JOIN summaries m ON m.id = k.summary_id WHERE k.item_id = c.id AND m.kind = 'normal')))`,
		"its original is gone and nothing stands for it; " + restoreFix},
	{"history", "a collected record still holds content",
		`SELECT 'e' || id FROM events WHERE collected_at IS NOT NULL
		   AND content <> json_object('collected', json_object('at', collected_at, 'reason', collected_reason))`,
		"it was written past the schema's trigger; " + restoreFix},
	{"history", "a collected record is still in the search index",
		`SELECT 'e' || e.id FROM events e JOIN history_fts f ON f.rowid = e.id WHERE e.collected_at IS NOT NULL`,
		"its text is still searchable; " + restoreFix},
	{"releases", "a session's active release is not recorded",
		`SELECT 'session ' || id FROM sessions WHERE policy_revision <> '' AND policy_revision NOT IN (SELECT id FROM behavior_releases)`,
		"activate a recorded release (klbr-core activate) or " + restoreFix},
}

// CheckDB verifies the database: SQLite's integrity_check and
// foreign_key_check, the state machines' invariants, and history coverage
// of every session's active context. It reads only.
func (s *Store) CheckDB(ctx context.Context) ([]Finding, error) {
	var out []Finding
	rows, err := s.rdb.QueryContext(ctx, "PRAGMA integrity_check")
	if err != nil {
		return nil, fmt.Errorf("check: integrity_check: %w", err)
	}
	for rows.Next() {
		var msg string
		if err := rows.Scan(&msg); err != nil {
			rows.Close()
			return nil, err
		}
		if msg != "ok" {
			out = append(out, Finding{Check: "integrity", Subject: FileName, Problem: msg,
				Fix: "the file is damaged: " + restoreFix})
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	rows, err = s.rdb.QueryContext(ctx, "PRAGMA foreign_key_check")
	if err != nil {
		return nil, fmt.Errorf("check: foreign_key_check: %w", err)
	}
	for rows.Next() {
		var table, parent string
		var rowid, fk any
		if err := rows.Scan(&table, &rowid, &parent, &fk); err != nil {
			rows.Close()
			return nil, err
		}
		out = append(out, Finding{Check: "foreign_keys", Subject: fmt.Sprintf("%s row %v", table, rowid),
			Problem: "refers to a missing " + parent + " row", Fix: restoreFix})
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	for _, inv := range invariants {
		rows, err := s.rdb.QueryContext(ctx, inv.query)
		if err != nil {
			if strings.Contains(err.Error(), "no such table") || strings.Contains(err.Error(), "no such column") {
				continue // an older schema: the family is not there yet
			}
			return nil, fmt.Errorf("check %s: %w", inv.check, err)
		}
		for rows.Next() {
			var subj string
			if err := rows.Scan(&subj); err != nil {
				rows.Close()
				return nil, err
			}
			out = append(out, Finding{Check: inv.check, Subject: subj, Problem: inv.rule, Fix: inv.fix})
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, err
		}
	}
	sessions, err := s.Sessions(ctx)
	if err != nil {
		return nil, fmt.Errorf("check: %w", err)
	}
	for _, ss := range sessions {
		if err := s.CheckCoverage(ctx, ss.ID, ss.ContextEpoch); err != nil {
			out = append(out, Finding{Check: "coverage", Subject: "session " + ss.ID, Problem: err.Error(),
				Fix: "the history's active context does not cover every record once: " + restoreFix})
		}
	}
	return out, nil
}

// CountRecords is how many rows the record families hold (what a check reads).
func (s *Store) CountRecords(ctx context.Context) (int64, error) {
	var n int64
	err := s.rdb.QueryRowContext(ctx, `SELECT (SELECT count(*) FROM events) + (SELECT count(*) FROM inputs) + (SELECT count(*) FROM inbox)`).Scan(&n)
	return n, err
}

// ArtifactRecord is an artifact the database knows.
type ArtifactRecord struct {
	SHA256    string
	Size      int64
	Retention string // retained, purged
}

// ArtifactRecords lists every artifact the database records.
func (s *Store) ArtifactRecords(ctx context.Context) ([]ArtifactRecord, error) {
	rows, err := s.rdb.QueryContext(ctx, `SELECT sha256, size, retention FROM artifacts ORDER BY sha256`)
	if err != nil {
		return nil, fmt.Errorf("artifacts: %w", err)
	}
	defer rows.Close()
	var out []ArtifactRecord
	for rows.Next() {
		var a ArtifactRecord
		if err := rows.Scan(&a.SHA256, &a.Size, &a.Retention); err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	return out, rows.Err()
}

// Tombstoned lists what garbage collection removed, by kind (release, artifact).
func (s *Store) Tombstoned(ctx context.Context, kind string) (map[string]bool, error) {
	rows, err := s.rdb.QueryContext(ctx, `SELECT ref FROM tombstones WHERE kind = ?`, kind)
	if err != nil {
		if strings.Contains(err.Error(), "no such table") {
			return map[string]bool{}, nil
		}
		return nil, fmt.Errorf("tombstones: %w", err)
	}
	defer rows.Close()
	out := map[string]bool{}
	for rows.Next() {
		var r string
		if err := rows.Scan(&r); err != nil {
			return nil, err
		}
		out[r] = true
	}
	return out, rows.Err()
}
