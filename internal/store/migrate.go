package store

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// ErrSchemaTooNew reports a database written by a newer klbr-core.
var ErrSchemaTooNew = errors.New("database schema is newer than this klbr-core")

type migration struct {
	version int
	name    string
	sql     string
	// compat: the migration only adds what an older binary ignores, so
	// the binary one schema version back may still run on the file.
	compat bool
}

// compatMarker, as a migration's first line, marks it readable by the
// previous version's binary.
const compatMarker = "-- compat: readable-by-previous"

// loadMigrations reads the embedded migrations, ordered by version. Versions
// must be 1, 2, 3, … without gaps, so a missing file cannot go unnoticed.
func loadMigrations(fsys fs.FS) ([]migration, error) {
	names, err := fs.Glob(fsys, "migrations/*.sql")
	if err != nil {
		return nil, err
	}
	var ms []migration
	for _, name := range names {
		base := strings.TrimPrefix(name, "migrations/")
		num, _, ok := strings.Cut(base, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil {
			return nil, fmt.Errorf("migration %s: name must be NNNN_description.sql", base)
		}
		body, err := fs.ReadFile(fsys, name)
		if err != nil {
			return nil, err
		}
		first, _, _ := strings.Cut(string(body), "\n")
		ms = append(ms, migration{version: v, name: base, sql: string(body), compat: strings.TrimSpace(first) == compatMarker})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].version < ms[j].version })
	for i, m := range ms {
		if m.version != i+1 {
			return nil, fmt.Errorf("migration %s: expected version %d", m.name, i+1)
		}
	}
	return ms, nil
}

// SchemaVersion is the schema version this binary migrates to.
func SchemaVersion() int {
	ms, err := loadMigrations(migrationFS)
	if err != nil {
		return 0
	}
	return len(ms)
}

// migrate brings the database up to the newest embedded version, one
// transaction per migration, and refuses a schema newer than it knows.
func migrate(ctx context.Context, db *sql.DB, ms []migration) error {
	var current int
	if err := db.QueryRowContext(ctx, "PRAGMA user_version").Scan(&current); err != nil {
		return fmt.Errorf("read schema version: %w", err)
	}
	if current > len(ms) {
		if rb, ok := fileReadableBy(ctx, db); ok && rb <= len(ms) {
			return nil // a newer binary's file, marked readable by this one: run on it, unmigrated
		}
		return fmt.Errorf("%w: the file is at version %d, this binary knows up to %d; run a klbr-core at least as new as the one that wrote it, or restore a backup", ErrSchemaTooNew, current, len(ms))
	}
	for _, m := range ms[current:] {
		if err := applyMigration(ctx, db, m); err != nil {
			return err
		}
	}
	return nil
}

func applyMigration(ctx context.Context, db *sql.DB, m migration) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("migration %s: begin: %w", m.name, err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, m.sql); err != nil {
		return fmt.Errorf("migration %s: %w", m.name, err)
	}
	rb := m.version
	if m.compat {
		rb = m.version - 1
	}
	if _, err := tx.ExecContext(ctx, `UPDATE schema_info SET readable_by = ? WHERE id = 1 AND EXISTS (SELECT 1 FROM sqlite_schema WHERE name = 'schema_info')`, rb); err != nil &&
		!strings.Contains(err.Error(), "no such table") {
		return fmt.Errorf("migration %s: set readable_by: %w", m.name, err)
	}
	if _, err := tx.ExecContext(ctx, fmt.Sprintf("PRAGMA user_version = %d", m.version)); err != nil {
		return fmt.Errorf("migration %s: set version: %w", m.name, err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("migration %s: commit: %w", m.name, err)
	}
	return nil
}

// fileReadableBy reads the oldest binary schema version the file admits;
// ok is false for a file from before schema_info existed.
func fileReadableBy(ctx context.Context, db *sql.DB) (int, bool) {
	var rb int
	if err := db.QueryRowContext(ctx, "SELECT readable_by FROM schema_info WHERE id = 1").Scan(&rb); err != nil {
		return 0, false
	}
	return rb, true
}

// readableBy is the oldest binary schema version that may run on a file at
// version v, by the embedded migrations' markers.
func readableBy(v int) int {
	ms, err := loadMigrations(migrationFS)
	if err != nil || v < 1 || v > len(ms) {
		return v
	}
	if ms[v-1].compat {
		return v - 1
	}
	return v
}
