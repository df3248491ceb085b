package store

import (
	"context"
	"fmt"
	"time"
)

// ReleasePin says why a release must not be collected.
type ReleasePin struct {
	Release string
	Reason  string // active in session X, last good of X, attempt N, job N, …
}

// ReleasePins lists the releases garbage collection must keep, by what
// the database knows: each session's active and last good release, the
// release of every attempt that has not ended, and of every job that may
// still run (pending or running: a schedule's routine runs its pinned
// release at each deadline). Drafts pin their parent release too; they live in
// files, so package datadir adds those.
func (s *Store) ReleasePins(ctx context.Context) ([]ReleasePin, error) {
	var out []ReleasePin
	queries := []string{
		`SELECT policy_revision, 'active in session ' || id FROM sessions WHERE policy_revision <> ''`,
		`SELECT release, 'attempt ' || id || ' (' || state || ')' FROM attempts WHERE release <> '' AND state IN ('running', 'waiting', 'paused')`,
		`SELECT release, 'job ' || id || ' (' || state || ')' FROM jobs WHERE release <> '' AND state IN ('pending', 'running')`,
	}
	for _, q := range queries {
		rows, err := s.rdb.QueryContext(ctx, q)
		if err != nil {
			return nil, fmt.Errorf("release pins: %w", err)
		}
		for rows.Next() {
			var p ReleasePin
			if err := rows.Scan(&p.Release, &p.Reason); err != nil {
				rows.Close()
				return nil, err
			}
			out = append(out, p)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, err
		}
	}
	good, err := s.LastGoodReleases(ctx)
	if err != nil {
		return nil, err
	}
	for _, g := range good {
		if g.Release != "" {
			out = append(out, ReleasePin{Release: g.Release, Reason: "last good of session " + g.Session})
		}
	}
	return out, nil
}

// ReleaseAges lists the recorded releases, newest first, with when each
// was published.
func (s *Store) ReleaseAges(ctx context.Context) ([]ReleaseAge, error) {
	rows, err := s.rdb.QueryContext(ctx, `SELECT id, published_at FROM behavior_releases ORDER BY published_at DESC, id`)
	if err != nil {
		return nil, fmt.Errorf("releases: %w", err)
	}
	defer rows.Close()
	var out []ReleaseAge
	for rows.Next() {
		var r ReleaseAge
		var at int64
		if err := rows.Scan(&r.ID, &at); err != nil {
			return nil, err
		}
		r.PublishedAt = time.UnixMilli(at)
		out = append(out, r)
	}
	return out, rows.Err()
}

// ReleaseAge is a recorded release and when it was published.
type ReleaseAge struct {
	ID          string
	PublishedAt time.Time
}

// CollectableArtifacts lists retained artifacts created before cutoff that
// no record of any session's active context refers to (through the record
// that produced them) — the ones a retention setting may remove.
func (s *Store) CollectableArtifacts(ctx context.Context, cutoff time.Time) ([]ArtifactRecord, error) {
	rows, err := s.rdb.QueryContext(ctx, `SELECT a.sha256, a.size, a.retention FROM artifacts a
		WHERE a.retention = 'retained' AND a.created_at < ?
		  AND NOT EXISTS (SELECT 1 FROM context_items c JOIN sessions s ON s.id = c.session_id AND s.context_epoch = c.context_epoch
		                  WHERE a.event_id IS NOT NULL AND c.event_id = a.event_id)
		ORDER BY a.sha256`, cutoff.UnixMilli())
	if err != nil {
		return nil, fmt.Errorf("collectable artifacts: %w", err)
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

// Tombstone records that garbage collection removes kind ref, and why.
// An artifact's record is marked purged with it.
func (t *Tx) Tombstone(kind, ref string, size int64, reason string) error {
	if _, err := t.exec(`INSERT INTO tombstones (kind, ref, size, reason, removed_at) VALUES (?, ?, ?, ?, ?)
		ON CONFLICT (kind, ref) DO UPDATE SET reason = excluded.reason, removed_at = excluded.removed_at`,
		kind, ref, size, reason, t.now.UnixMilli()); err != nil {
		return fmt.Errorf("tombstone: %w", err)
	}
	if kind == "artifact" {
		if _, err := t.exec(`UPDATE artifacts SET retention = 'purged' WHERE sha256 = ?`, ref); err != nil {
			return fmt.Errorf("tombstone: %w", err)
		}
	}
	return nil
}

// TombstoneRecord is one removal garbage collection recorded.
type TombstoneRecord struct {
	Kind      string    `json:"kind"`
	Ref       string    `json:"ref"`
	Size      int64     `json:"size"`
	Reason    string    `json:"reason"`
	RemovedAt time.Time `json:"removed_at"`
}

// Tombstones lists every removal, newest first.
func (s *Store) Tombstones(ctx context.Context) ([]TombstoneRecord, error) {
	rows, err := s.rdb.QueryContext(ctx, `SELECT kind, ref, size, reason, removed_at FROM tombstones ORDER BY id DESC`)
	if err != nil {
		return nil, fmt.Errorf("tombstones: %w", err)
	}
	defer rows.Close()
	var out []TombstoneRecord
	for rows.Next() {
		var r TombstoneRecord
		var at int64
		if err := rows.Scan(&r.Kind, &r.Ref, &r.Size, &r.Reason, &at); err != nil {
			return nil, err
		}
		r.RemovedAt = time.UnixMilli(at)
		out = append(out, r)
	}
	return out, rows.Err()
}
