package store

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The test binary doubles as the child process of the lock and kill tests.
func TestMain(m *testing.M) {
	switch os.Getenv("KLBR_STORE_CHILD") {
	case "hold":
		childHold(os.Getenv("KLBR_STORE_DIR"))
		return
	case "admit":
		childAdmit(os.Getenv("KLBR_STORE_DIR"))
		return
	case "steps":
		childSteps(os.Getenv("KLBR_STORE_DIR"))
		return
	}
	os.Exit(m.Run())
}

// childHold opens the store, says so, and waits to be killed.
func childHold(dir string) {
	s, err := Open(context.Background(), dir, Options{})
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	defer s.Close()
	fmt.Println("ready")
	time.Sleep(time.Minute)
}

// childAdmit admits inputs forever, printing each id only after Write returned.
func childAdmit(dir string) {
	s, err := Open(context.Background(), dir, Options{})
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	out := bufio.NewWriter(os.Stdout)
	for i := 0; ; i++ {
		var a Admitted
		err := s.Write(context.Background(), func(tx *Tx) (err error) {
			a, err = tx.AdmitInput(testInput("default", fmt.Sprintf("k%d", i), "hello"))
			return err
		})
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		fmt.Fprintf(out, "%d %s\n", a.InputID, fmt.Sprintf("k%d", i))
		out.Flush()
	}
}

func testInput(session, key, body string) NewInput {
	now := time.Now()
	return NewInput{Session: session, SourceKind: "operator", SourceKey: key, Conversation: "operator",
		Author: "operator", OccurredAt: now, ReceivedAt: now, Body: body}
}

func openTest(t *testing.T, dir string, opts Options) *Store {
	t.Helper()
	s, err := Open(context.Background(), dir, opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func newStore(t *testing.T) *Store {
	t.Helper()
	s := openTest(t, t.TempDir(), Options{})
	mustWrite(t, s, func(tx *Tx) error { _, err := tx.EnsureSession("default"); return err })
	return s
}

func mustWrite(t *testing.T, s *Store, fn func(*Tx) error) {
	t.Helper()
	if err := s.Write(context.Background(), fn); err != nil {
		t.Fatalf("Write: %v", err)
	}
}

func TestPragmasReadBack(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	if err := verifyPragmas(ctx, s.wdb, false); err != nil {
		t.Errorf("writer: %v", err)
	}
	if err := verifyPragmas(ctx, s.rdb, true); err != nil {
		t.Errorf("readers: %v", err)
	}
	if _, err := s.rdb.ExecContext(ctx, "INSERT INTO owner (id, pid, host, started_at) VALUES (1, 1, 'x', 1)"); err == nil {
		t.Error("a reader connection accepted a write")
	}
}

func TestMigrateFromEmptyFile(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, FileName), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	s := openTest(t, dir, Options{})
	var v int
	if err := s.rdb.QueryRow("PRAGMA user_version").Scan(&v); err != nil {
		t.Fatal(err)
	}
	if v != SchemaVersion() || v < 1 {
		t.Fatalf("user_version = %d, want %d", v, SchemaVersion())
	}
	for _, table := range []string{"owner", "sessions", "events", "session_items", "inputs", "inbox", "attention_frames"} {
		var n int
		if err := s.rdb.QueryRow("SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = ?", table).Scan(&n); err != nil || n != 1 {
			t.Errorf("table %s missing (n=%d, err=%v)", table, n, err)
		}
	}
	s.Close()
	// Reopening an up-to-date file migrates nothing and keeps the data.
	s2 := openTest(t, dir, Options{})
	if err := s2.rdb.QueryRow("PRAGMA user_version").Scan(&v); err != nil || v != SchemaVersion() {
		t.Fatalf("after reopen user_version = %d, %v", v, err)
	}
}

func TestNewerSchemaRefused(t *testing.T) {
	dir := t.TempDir()
	s := openTest(t, dir, Options{})
	s.Close()
	registerDrivers()
	db, err := sql.Open(driverWrite, dsn(filepath.Join(dir, FileName)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(fmt.Sprintf("PRAGMA user_version = %d", SchemaVersion()+1)); err != nil {
		t.Fatal(err)
	}
	// The newer binary's migration was not backward-readable.
	if _, err := db.Exec("UPDATE schema_info SET readable_by = ?", SchemaVersion()+1); err != nil {
		t.Fatal(err)
	}
	db.Close()
	_, err = Open(context.Background(), dir, Options{})
	if !errors.Is(err, ErrSchemaTooNew) {
		t.Fatalf("Open of a newer schema: %v, want ErrSchemaTooNew", err)
	}
	if !strings.Contains(err.Error(), fmt.Sprintf("version %d", SchemaVersion()+1)) {
		t.Errorf("error does not name the version: %v", err)
	}
	// The refused open released the lock.
	if held, _, err := Holder(context.Background(), dir); held || err != nil {
		t.Errorf("after a refused open: held=%v err=%v", held, err)
	}
}

func TestMigrationsAreNumberedWithoutGaps(t *testing.T) {
	ms, err := loadMigrations(migrationFS)
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) == 0 {
		t.Fatal("no migrations embedded")
	}
}

func TestCheckSQLiteVersion(t *testing.T) {
	for _, tc := range []struct {
		version string
		ok      bool
	}{
		{"3.51.3", true}, {"3.51.2", false}, {"3.54.1", true}, {"3.52.0", true}, {"4.0.0", true},
		{"3.50.7", true}, {"3.50.6", false}, {"3.44.6", true}, {"3.44.9", true}, {"3.44.5", false},
		{"3.45.0", false}, {"3.40.1", false}, {"3.51", false}, {"x.y.z", false}, {"", false},
	} {
		t.Run(tc.version, func(t *testing.T) {
			err := CheckSQLiteVersion(tc.version)
			if (err == nil) != tc.ok {
				t.Fatalf("CheckSQLiteVersion(%q) = %v, want ok=%v", tc.version, err, tc.ok)
			}
			if err != nil && !errors.Is(err, ErrSQLiteVersion) {
				t.Fatalf("error is not ErrSQLiteVersion: %v", err)
			}
		})
	}
}

func TestOpenRefusesOldSQLite(t *testing.T) {
	dir := t.TempDir()
	_, err := Open(context.Background(), dir, Options{SQLiteVersion: "3.40.1"})
	if !errors.Is(err, ErrSQLiteVersion) {
		t.Fatalf("Open with 3.40.1: %v, want ErrSQLiteVersion", err)
	}
	if !strings.Contains(err.Error(), "3.40.1") {
		t.Errorf("error does not name the version found: %v", err)
	}
}

func TestLinkedSQLitePassesGuard(t *testing.T) {
	info, err := ReadRuntimeInfo(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckSQLiteVersion(info.Version); err != nil {
		t.Fatalf("the linked SQLite fails the guard: %v", err)
	}
	if len(info.CompileOptions) == 0 {
		t.Error("no compile options reported")
	}
}

func TestSecondProcessIsRefusedWithHolderNamed(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "KLBR_STORE_CHILD=hold", "KLBR_STORE_DIR="+dir)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "ready" {
		t.Fatalf("child: %q %v", line, err)
	}

	_, err = Open(context.Background(), dir, Options{})
	var held *HeldError
	if !errors.As(err, &held) || !errors.Is(err, ErrHeld) {
		t.Fatalf("second Open: %v, want *HeldError", err)
	}
	if held.Owner == nil || held.Owner.PID != cmd.Process.Pid {
		t.Fatalf("holder = %+v, want pid %d", held.Owner, cmd.Process.Pid)
	}
	if !strings.Contains(err.Error(), "pid "+strconv.Itoa(cmd.Process.Pid)) {
		t.Errorf("message does not name the holder: %v", err)
	}
	if isHeld, owner, err := Holder(context.Background(), dir); !isHeld || owner == nil || owner.PID != cmd.Process.Pid || err != nil {
		t.Errorf("Holder = %v %+v %v", isHeld, owner, err)
	}

	// Once the holder dies the kernel drops the lock, and a new owner takes over.
	cmd.Process.Kill()
	cmd.Wait()
	s := openTest(t, dir, Options{})
	if s.Owner().PID != os.Getpid() {
		t.Errorf("owner pid = %d", s.Owner().PID)
	}
}

func TestAcknowledgedInputSurvivesSIGKILL(t *testing.T) {
	dir := t.TempDir()
	s := openTest(t, dir, Options{})
	mustWrite(t, s, func(tx *Tx) error { _, err := tx.EnsureSession("default"); return err })
	s.Close()

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "KLBR_STORE_CHILD=admit", "KLBR_STORE_DIR="+dir)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	acked := map[int64]string{}
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		var id int64
		var key string
		if _, err := fmt.Sscanf(sc.Text(), "%d %s", &id, &key); err != nil {
			t.Fatalf("child said %q", sc.Text())
		}
		acked[id] = key
		if len(acked) == 200 {
			// Kill right after an acknowledgement, with the child mid-way through more writes.
			cmd.Process.Signal(syscall.SIGKILL)
			break
		}
	}
	cmd.Wait()
	if len(acked) < 200 {
		t.Fatalf("child acknowledged only %d inputs", len(acked))
	}

	s2 := openTest(t, dir, Options{})
	for id, key := range acked {
		var got string
		if err := s2.rdb.QueryRow("SELECT source_key FROM inputs WHERE id = ?", id).Scan(&got); err != nil || got != key {
			t.Fatalf("acknowledged input %d (%s) after SIGKILL: %q %v", id, key, got, err)
		}
	}
}

func TestFailedCommitIsNeverAcknowledged(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	start := make(chan struct{})
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			errs[i] = s.Write(ctx, func(tx *Tx) error {
				_, err := tx.AdmitInput(testInput("default", fmt.Sprintf("c%d", i), "x"))
				if err == nil && i == 0 {
					// A deferred foreign-key violation passes every statement and
					// fails only at COMMIT: the batch it rides in must not be acked.
					if _, err = tx.exec("PRAGMA defer_foreign_keys = ON"); err == nil {
						_, err = tx.exec("INSERT INTO inbox (input_id, session_id, state, updated_at) VALUES (999999, 'default', 'pending', 0)")
					}
				}
				return err
			})
		}()
	}
	close(start)
	wg.Wait()
	var n int
	if err := s.rdb.QueryRow("SELECT count(*) FROM inputs").Scan(&n); err != nil {
		t.Fatal(err)
	}
	acked := 0
	for _, err := range errs {
		if err == nil {
			acked++
		}
	}
	if errs[0] == nil {
		t.Fatal("the write whose commit must fail was acknowledged")
	}
	if acked != n {
		t.Fatalf("%d writes acknowledged but %d inputs stored", acked, n)
	}
}

func TestFailingWriteDoesNotSinkItsBatch(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make([]error, 50)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = s.Write(ctx, func(tx *Tx) error {
				if _, err := tx.AdmitInput(testInput("default", fmt.Sprintf("f%d", i), "x")); err != nil {
					return err
				}
				if i%5 == 0 {
					return errors.New("refused after writing")
				}
				if i%7 == 0 {
					panic("write function panics")
				}
				return nil
			})
		}()
	}
	wg.Wait()
	want := 0
	for i, err := range errs {
		bad := i%5 == 0 || i%7 == 0
		if bad != (err != nil) {
			t.Errorf("write %d: err=%v", i, err)
		}
		if !bad {
			want++
		}
	}
	var n int
	s.rdb.QueryRow("SELECT count(*) FROM inputs").Scan(&n)
	var events int
	s.rdb.QueryRow("SELECT count(*) FROM events").Scan(&events)
	if n != want || events != want {
		t.Fatalf("inputs=%d events=%d, want %d: a failed write left rows behind", n, events, want)
	}
}

func TestConcurrentAdmissionsWithDuplicates(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	const total, dups = 10000, 2000
	// Callers 0..7999 use unique keys; callers 8000..9999 repeat keys 0..1999.
	keyOf := func(i int) string {
		if i >= total-dups {
			i -= total - dups
		}
		return fmt.Sprintf("key-%d", i)
	}
	results := make([]Admitted, total)
	errs := make([]error, total)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 256) // many concurrent callers, bounded goroutine burst
	for i := range total {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			errs[i] = s.Write(ctx, func(tx *Tx) (err error) {
				results[i], err = tx.AdmitInput(testInput("default", keyOf(i), "body "+keyOf(i)))
				return err
			})
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("admission %d: %v", i, err)
		}
	}
	var rows int
	s.rdb.QueryRow("SELECT count(*) FROM inputs").Scan(&rows)
	if rows != total-dups {
		t.Fatalf("inputs = %d, want %d", rows, total-dups)
	}
	byKey := map[string]int64{}
	rs, err := s.rdb.Query("SELECT id, source_key FROM inputs")
	if err != nil {
		t.Fatal(err)
	}
	for rs.Next() {
		var id int64
		var key string
		rs.Scan(&id, &key)
		byKey[key] = id
	}
	rs.Close()
	duplicates := 0
	for i, r := range results {
		if r.InputID != byKey[keyOf(i)] {
			t.Fatalf("caller %d got id %d, key %s is id %d", i, r.InputID, keyOf(i), byKey[keyOf(i)])
		}
		if r.Duplicate {
			duplicates++
		}
	}
	if duplicates != dups {
		t.Fatalf("%d callers told duplicate, want %d", duplicates, dups)
	}
	st := s.Stats()
	if st.Batches >= st.Writes {
		t.Errorf("no group commit: %d batches for %d writes", st.Batches, st.Writes)
	}
	t.Logf("%d writes in %d transactions", st.Writes, st.Batches)
}

func TestReadersDoNotBlockTheWriter(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	mustWrite(t, s, func(tx *Tx) error { _, err := tx.AdmitInput(testInput("default", "a", "x")); return err })
	// Hold a read transaction open across a write.
	rtx, err := s.rdb.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer rtx.Rollback()
	var before int
	rtx.QueryRow("SELECT count(*) FROM inputs").Scan(&before)
	wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := s.Write(wctx, func(tx *Tx) error { _, err := tx.AdmitInput(testInput("default", "b", "x")); return err }); err != nil {
		t.Fatalf("write while a reader is open: %v", err)
	}
	var during int
	rtx.QueryRow("SELECT count(*) FROM inputs").Scan(&during)
	if during != before {
		t.Errorf("the open reader saw the new write: %d → %d (not a snapshot)", before, during)
	}
}

func TestHistoryIsAppendOnly(t *testing.T) {
	s := newStore(t)
	mustWrite(t, s, func(tx *Tx) error { _, err := tx.AdmitInput(testInput("default", "a", "x")); return err })
	for _, q := range []string{
		"UPDATE events SET content = '{}'",
		"DELETE FROM events",
		"UPDATE session_items SET lane = 'speech'",
		"DELETE FROM session_items",
	} {
		err := s.Write(context.Background(), func(tx *Tx) error { _, err := tx.exec(q); return err })
		if err == nil || !strings.Contains(err.Error(), "append-only") {
			t.Errorf("%s: %v, want an append-only refusal", q, err)
		}
	}
}

func TestWriteAfterCloseFails(t *testing.T) {
	s := newStore(t)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := s.Write(context.Background(), func(*Tx) error { return nil }); !errors.Is(err, ErrClosed) {
		t.Fatalf("Write after Close: %v", err)
	}
}
