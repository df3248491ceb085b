package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	_ "github.com/mattn/go-sqlite3" // writes the old version's file

	"github.com/klbr-dev/klbr/internal/store"
)

// TestUpgradePath walks docs/operating.md's upgrade: a data directory an
// old klbr-core left (frozen at schema 1, with an input in it) is backed up,
// the new binary serves it (migrating forward before it answers), status
// and doctor say the schema and whether a downgrade is possible, drain
// ends it cleanly, it serves again without migrating twice, and the
// migrated directory checks clean with the old input kept.
func TestUpgradePath(t *testing.T) {
	in := newInstance(t)
	dump, err := os.ReadFile(filepath.Join("..", "..", "internal", "store", "testdata", "schema_v1.sql"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(in.dir, 0o700); err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("sqlite3", "file:"+filepath.Join(in.dir, store.FileName)+"?_journal_mode=WAL")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(string(dump)); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("PRAGMA user_version = 1"); err != nil {
		t.Fatal(err)
	}
	db.Close()
	// doctor fails on the old directory (no operator token yet) but says what the start will do.
	if out, _, _ := in.run(nil, "doctor"); !strings.Contains(out, "migrates it to") {
		t.Errorf("doctor on the old file does not say it will migrate:\n%s", out)
	}
	in.must("init") // the old version's directory lacked the token and subdirectories init makes
	in.must("backup", filepath.Join(t.TempDir(), "before-upgrade"))

	srv := in.serve()
	var st struct {
		Schema store.SchemaStatus `json:"schema"`
		Sizes  store.StorageSizes `json:"sizes"`
	}
	if err := json.Unmarshal([]byte(in.must("status", "--json")), &st); err != nil {
		t.Fatal(err)
	}
	if st.Schema.Version != store.SchemaVersion() || st.Schema.Binary != store.SchemaVersion() || st.Sizes.Database == 0 {
		t.Errorf("status after the upgrade: %+v", st)
	}
	if out := in.must("status"); !strings.Contains(out, "schema") || !strings.Contains(out, "wal") {
		t.Errorf("status does not show the schema and storage:\n%s", out)
	}
	in.must("drain")
	if err := srv.wait(t); err != nil {
		t.Fatalf("drain: %v\n%s", err, srv.log())
	}
	srv = in.serve() // the restart: nothing left to migrate
	in.must("drain")
	if err := srv.wait(t); err != nil {
		t.Fatalf("second drain: %v", err)
	}
	if out, errOut, err := in.run(nil, "check"); err != nil || !strings.Contains(out, ": clean") {
		t.Fatalf("check after the upgrade: %v\n%s%s", err, out, errOut)
	}
	stm, err := store.Open(context.Background(), in.dir, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	recs, err := stm.Records(context.Background(), "default", 0, 10)
	stm.Close()
	if err != nil || len(recs) == 0 || !strings.Contains(string(recs[0].Content), "from v1") {
		t.Errorf("the old version's input after the upgrade: %+v %v", recs, err)
	}
	if out, _, _ := in.run(nil, "doctor"); !strings.Contains(out, "can still run on it") && !strings.Contains(out, "no downgrade") {
		t.Errorf("doctor does not say whether a downgrade is possible:\n%s", out)
	}
}
