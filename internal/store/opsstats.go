package store

import (
	"context"
	"database/sql"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"
)

// LastGood is a session's last good release: the release of its newest
// activation whose release differs from the active one, which is where
// `klbr-core rollback` goes (the rollback verifies it first).
type LastGood struct {
	Session string
	Release string // "" when the session has had no other release
	Epoch   int64
}

// LastGoodReleases reports every session's last good release.
func (s *Store) LastGoodReleases(ctx context.Context) ([]LastGood, error) {
	rows, err := s.rdb.QueryContext(ctx, `
		SELECT s.id, coalesce((SELECT a.release_id FROM activations a
		        WHERE a.session_id = s.id AND a.release_id <> s.policy_revision ORDER BY a.epoch DESC LIMIT 1), ''),
		       coalesce((SELECT a.epoch FROM activations a
		        WHERE a.session_id = s.id AND a.release_id <> s.policy_revision ORDER BY a.epoch DESC LIMIT 1), 0)
		FROM sessions s ORDER BY s.id`)
	if err != nil {
		return nil, fmt.Errorf("last good releases: %w", err)
	}
	defer rows.Close()
	var out []LastGood
	for rows.Next() {
		var l LastGood
		if err := rows.Scan(&l.Session, &l.Release, &l.Epoch); err != nil {
			return nil, err
		}
		out = append(out, l)
	}
	return out, rows.Err()
}

// OldestUnanswered reports, by session, when the oldest directed attention
// item (a DM or mention) that is still pending or only seen arrived.
// Sessions without one are absent.
func (s *Store) OldestUnanswered(ctx context.Context) (map[string]time.Time, error) {
	rows, err := s.rdb.QueryContext(ctx, `SELECT session_id, min(created_at) FROM attention_items
		WHERE status IN ('pending', 'seen') GROUP BY session_id`)
	if err != nil {
		return nil, fmt.Errorf("unanswered items: %w", err)
	}
	defer rows.Close()
	out := map[string]time.Time{}
	for rows.Next() {
		var id string
		var at int64
		if err := rows.Scan(&id, &at); err != nil {
			return nil, err
		}
		out[id] = time.UnixMilli(at)
	}
	return out, rows.Err()
}

// StorageSizes are the bytes a data directory holds, by part.
type StorageSizes struct {
	Database  int64 `json:"database_bytes"`
	WAL       int64 `json:"wal_bytes"`
	Artifacts int64 `json:"artifacts_bytes"`
	Releases  int64 `json:"releases_bytes"`
}

// Sizes measures the database, its WAL, and the artifact and release trees.
func (s *Store) Sizes() StorageSizes { return DirSizes(s.dir) }

// DirSizes measures a data directory without opening it.
func DirSizes(dir string) StorageSizes {
	return StorageSizes{
		Database:  fileSize(filepath.Join(dir, FileName)),
		WAL:       fileSize(filepath.Join(dir, FileName+"-wal")),
		Artifacts: treeSize(filepath.Join(dir, "artifacts")),
		Releases:  treeSize(filepath.Join(dir, "releases")),
	}
}

func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

func treeSize(root string) int64 {
	var n int64
	filepath.WalkDir(root, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}

// SchemaStatus says which schema a database is at, which this binary
// writes, and whether an older binary could still open it.
type SchemaStatus struct {
	Version int `json:"version"` // PRAGMA user_version of the file
	Binary  int `json:"binary"`  // the newest version this binary migrates to
	// ReadableBy is the oldest schema version whose binary can still run
	// on this file: migrations stay backward-readable for one release.
	ReadableBy int  `json:"readable_by"`
	Downgrade  bool `json:"downgrade_possible"`
}

// Schema reads the open database's schema status.
func (s *Store) Schema(ctx context.Context) (SchemaStatus, error) {
	return schemaStatus(ctx, s.rdb)
}

func schemaStatus(ctx context.Context, db *sql.DB) (SchemaStatus, error) {
	var st SchemaStatus
	if err := db.QueryRowContext(ctx, "PRAGMA user_version").Scan(&st.Version); err != nil {
		return st, fmt.Errorf("schema version: %w", err)
	}
	st.Binary = SchemaVersion()
	if rb, ok := fileReadableBy(ctx, db); ok {
		st.ReadableBy = rb
	} else {
		st.ReadableBy = readableBy(st.Version)
	}
	st.Downgrade = st.ReadableBy < st.Version
	return st, nil
}

// TreeSize is the bytes of the regular files under root.
func TreeSize(root string) int64 { return treeSize(root) }
