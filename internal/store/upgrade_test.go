package store

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// TestUpgradeFrozenV1 opens a database frozen at schema version 1 and checks
// that the current binary migrates it forward keeping its rows usable.
func TestUpgradeFrozenV1(t *testing.T) {
	dump, err := os.ReadFile("testdata/schema_v1.sql")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	registerDrivers()
	db, err := sql.Open(driverWrite, dsn(filepath.Join(dir, FileName)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(string(dump)); err != nil {
		t.Fatalf("load frozen v1: %v", err)
	}
	if _, err := db.Exec("PRAGMA user_version = 1"); err != nil {
		t.Fatal(err)
	}
	db.Close()

	s := openTest(t, dir, Options{})
	var v int
	s.rdb.QueryRow("PRAGMA user_version").Scan(&v)
	if v != SchemaVersion() {
		t.Fatalf("user_version = %d, want %d", v, SchemaVersion())
	}
	recs, err := s.Records(context.Background(), "default", 0, 10)
	if err != nil || len(recs) != 1 {
		t.Fatalf("records from v1: %+v %v", recs, err)
	}
	// The migration counted the v1 input into the backlog, with its receipt time.
	if got, err := s.PendingStats(context.Background()); err != nil || len(got) != 1 || got[0] != recount(t, s)[0] {
		t.Fatalf("the backlog after the upgrade: %+v %v; a recount says %+v", got, err, recount(t, s))
	}
	// The v1 input still deduplicates and can be claimed and framed.
	var again Admitted
	mustWrite(t, s, func(tx *Tx) (err error) {
		again, err = tx.AdmitInput(testInput("default", "v1-key", "retry"))
		return err
	})
	if !again.Duplicate || again.InputID != 1 {
		t.Fatalf("v1 input not found by its source key: %+v", again)
	}
	mustWrite(t, s, func(tx *Tx) error {
		items, err := tx.ClaimPending("default", 10)
		if err != nil || len(items) != 1 {
			return err
		}
		_, err = tx.CommitFrame(Frame{Session: "default", InputIDs: []int64{items[0].InputID}})
		return err
	})
	if got, err := s.PendingStats(context.Background()); err != nil || len(got) != 0 {
		t.Fatalf("the backlog after the frame: %+v %v", got, err)
	}
}

// TestRollbackBinaryOnCompatibleSchema: a file migrated by a newer binary
// whose migration is marked backward-readable still opens under this one
// (the rollback of the binary keeps working), unmigrated, and Schema says
// a downgrade is possible; a file that is not readable says so.
func TestRollbackBinaryOnCompatibleSchema(t *testing.T) {
	dir := t.TempDir()
	s := openTest(t, dir, Options{})
	st, err := s.Schema(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.Version != SchemaVersion() || st.Binary != SchemaVersion() || st.ReadableBy != SchemaVersion()-1 || !st.Downgrade {
		t.Fatalf("schema status of a fresh file: %+v (the newest migration is marked readable-by-previous)", st)
	}
	s.Close()
	registerDrivers()
	db, err := sql.Open(driverWrite, dsn(filepath.Join(dir, FileName)))
	if err != nil {
		t.Fatal(err)
	}
	next := SchemaVersion() + 1
	if _, err := db.Exec("PRAGMA user_version = " + strconv.Itoa(next)); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("UPDATE schema_info SET readable_by = ?", next-1); err != nil {
		t.Fatal(err)
	}
	db.Close()
	s = openTest(t, dir, Options{})
	st, err = s.Schema(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.Version != next || st.Binary != next-1 || !st.Downgrade {
		t.Fatalf("schema status under the older binary: %+v", st)
	}
}
