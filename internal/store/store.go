package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// FileName is the database file inside the data directory.
const FileName = "runtime.sqlite"

// ErrClosed is returned by writes submitted after Close began.
var ErrClosed = errors.New("store is closed")

// Options tune Open. The zero value is the production configuration.
type Options struct {
	// Clock returns the current time; nil means time.Now.
	Clock func() time.Time
	// SQLiteVersion, when set, replaces the runtime's sqlite_version() for the
	// version guard. Tests use it to prove that an old runtime is refused.
	SQLiteVersion string
	// MaxBatch bounds how many writes share one transaction; 0 means 256.
	MaxBatch int
	// ReadConns bounds the reader pool; 0 means 4.
	ReadConns int
	Logger    *slog.Logger
}

// Store is the open database of one data directory, owned by this process.
type Store struct {
	dir   string
	clock func() time.Time
	log   *slog.Logger
	lock  *dirLock
	wdb   *sql.DB // exactly one connection, used only by the writer goroutine
	rdb   *sql.DB // query-only connections
	info  RuntimeInfo
	owner Owner

	reqs    chan *writeReq
	closing chan struct{}
	done    chan struct{}

	// The lexical index is kept up to date off the write path: appends
	// kick the indexer, which indexes a batch after a short delay, and a
	// search first indexes whatever is still pending.
	indexed     atomic.Int64  // the highest event id the index has looked at
	indexMu     sync.Mutex    // one catch-up at a time
	indexKick   chan struct{} // buffered(1)
	indexerDone chan struct{}
	maxBatch    int
	stats       writerStats
	ckpt        checkpointStats
	stmts       *stmtCache // the writer goroutine's prepared statements

	closeOnce sync.Once
	closeErr  error
	readOnly  bool // OpenReader's: no writer, no lock

	faults faults // storage health: a fault in force, until a commit succeeds

	watchMu  sync.Mutex                       // guards watchers
	watchers map[string]map[*watcher]struct{} // by session id
	control  map[string]int64                 // ControlGen by session id
}

// Open takes the data directory's owner lock, opens and verifies the
// database, migrates it, records this process as the owner and starts the
// writer. A second process on the same directory gets a *HeldError.
func Open(ctx context.Context, dir string, opts Options) (*Store, error) {
	registerDrivers()
	if opts.Clock == nil {
		opts.Clock = time.Now
	}
	if opts.MaxBatch <= 0 {
		opts.MaxBatch = 256
	}
	if opts.ReadConns <= 0 {
		opts.ReadConns = 4
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	lock, err := lockDirAfterDeadOwner(ctx, dir)
	if errors.Is(err, errLocked) {
		return nil, &HeldError{Dir: dir, Owner: readOwner(ctx, dir)}
	}
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	s := &Store{
		dir: dir, clock: opts.Clock, log: opts.Logger, lock: lock,
		reqs: make(chan *writeReq), closing: make(chan struct{}), done: make(chan struct{}), faults: faults{began: make(chan struct{}, 1)},
		indexKick: make(chan struct{}, 1), indexerDone: make(chan struct{}),
		maxBatch: opts.MaxBatch, watchers: map[string]map[*watcher]struct{}{}, control: map[string]int64{},
	}
	if err := s.open(ctx, opts); err != nil {
		s.closeDBs()
		lock.release()
		return nil, err
	}
	s.stmts = &stmtCache{db: s.wdb, m: map[string]*sql.Stmt{}, inTx: map[string]*sql.Stmt{}, missed: map[string]struct{}{}, states: map[string]SessionState{}}
	go s.writer()
	go s.indexer()
	return s, nil
}

func (s *Store) open(ctx context.Context, opts Options) error {
	path := filepath.Join(s.dir, FileName)
	var err error
	if s.wdb, err = sql.Open(driverWrite, dsn(path)); err != nil {
		return fmt.Errorf("store: open: %w", err)
	}
	s.wdb.SetMaxOpenConns(1)
	s.wdb.SetMaxIdleConns(1)
	s.wdb.SetConnMaxLifetime(0)
	if s.info, err = readRuntimeInfo(ctx, s.wdb); err != nil {
		return fmt.Errorf("store: %w", err)
	}
	checked := s.info.Version
	if opts.SQLiteVersion != "" {
		checked = opts.SQLiteVersion
	}
	if err := CheckSQLiteVersion(checked); err != nil {
		return fmt.Errorf("store: %w", err)
	}
	if err := verifyPragmas(ctx, s.wdb, false); err != nil {
		return fmt.Errorf("store: %w", err)
	}
	ms, err := loadMigrations(migrationFS)
	if err != nil {
		return fmt.Errorf("store: %w", err)
	}
	if err := migrate(ctx, s.wdb, ms); err != nil {
		if strings.Contains(err.Error(), "no such module: fts5") {
			return fmt.Errorf("store: %w (this binary was built without FTS5: build with `make`, or with `go build -tags sqlite_fts5`)", err)
		}
		return fmt.Errorf("store: %w", err)
	}
	through, err := catchUpIndex(ctx, s.wdb)
	if err != nil {
		return fmt.Errorf("store: %w", err)
	}
	s.indexed.Store(through)
	if err := os.Chmod(path, 0o600); err != nil {
		return fmt.Errorf("store: %w", err)
	}
	if s.rdb, err = sql.Open(driverRead, readDSN(path)); err != nil {
		return fmt.Errorf("store: open readers: %w", err)
	}
	s.rdb.SetMaxOpenConns(opts.ReadConns)
	s.rdb.SetMaxIdleConns(opts.ReadConns)
	s.owner = currentOwner(s.clock())
	if _, err := s.wdb.ExecContext(ctx,
		`INSERT INTO owner (id, pid, host, started_at) VALUES (1, ?, ?, ?)
		 ON CONFLICT (id) DO UPDATE SET pid = excluded.pid, host = excluded.host, started_at = excluded.started_at`,
		s.owner.PID, s.owner.Host, s.owner.StartedAt.UnixMilli()); err != nil {
		return fmt.Errorf("store: record owner: %w", err)
	}
	return nil
}

// verifyPragmas reads the settings back, so a driver or file that silently
// ignored one cannot pass for durable.
func verifyPragmas(ctx context.Context, db *sql.DB, readOnly bool) error {
	want := []struct {
		pragma string
		value  string
	}{
		{"journal_mode", "wal"},
		{"synchronous", "2"}, // FULL
		{"foreign_keys", "1"},
		{"busy_timeout", fmt.Sprint(BusyTimeoutMillis)},
	}
	if readOnly {
		want = append(want, struct{ pragma, value string }{"query_only", "1"})
	} else {
		want = append(want, struct{ pragma, value string }{"wal_autocheckpoint", fmt.Sprint(WALAutocheckpointPages)},
			struct{ pragma, value string }{"journal_size_limit", fmt.Sprint(JournalSizeLimitBytes)})
	}
	for _, w := range want {
		var got string
		if err := db.QueryRowContext(ctx, "PRAGMA "+w.pragma).Scan(&got); err != nil {
			return fmt.Errorf("read pragma %s: %w", w.pragma, err)
		}
		if got != w.value {
			return fmt.Errorf("pragma %s is %q, want %q", w.pragma, got, w.value)
		}
	}
	return nil
}

// Dir is the data directory this store owns.
func (s *Store) Dir() string { return s.dir }

// Info is the SQLite runtime this store runs on.
func (s *Store) Info() RuntimeInfo { return s.info }

// Owner is this process's owner record.
func (s *Store) Owner() Owner { return s.owner }

// Close stops accepting writes, finishes every write already accepted,
// closes the database and releases the lock. Calling it again is safe.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		if s.readOnly {
			s.closeErr = s.rdb.Close()
			return
		}
		close(s.closing)
		<-s.done
		<-s.indexerDone
		s.stmts.close()
		s.closeErr = errors.Join(s.closeDBs(), s.lock.release())
	})
	return s.closeErr
}

func (s *Store) closeDBs() error {
	var errs []error
	if s.rdb != nil {
		errs = append(errs, s.rdb.Close())
	}
	if s.wdb != nil {
		errs = append(errs, s.wdb.Close())
	}
	return errors.Join(errs...)
}

// readOwner reads the owner row without taking the lock, for error messages
// and doctor. It returns nil when nothing can be read.
func readOwner(ctx context.Context, dir string) *Owner {
	path := filepath.Join(dir, FileName)
	if _, err := os.Stat(path); err != nil {
		return nil
	}
	registerDrivers()
	db, err := sql.Open(driverRead, readDSN(path))
	if err != nil {
		return nil
	}
	defer db.Close()
	var o Owner
	var started int64
	if err := db.QueryRowContext(ctx, "SELECT pid, host, started_at FROM owner WHERE id = 1").Scan(&o.PID, &o.Host, &started); err != nil {
		return nil
	}
	o.StartedAt = time.UnixMilli(started)
	return &o
}

// Holder reports whether another process holds dir, and who, without
// disturbing it. It is what doctor prints.
func Holder(ctx context.Context, dir string) (held bool, owner *Owner, err error) {
	lock, err := lockDir(dir)
	if errors.Is(err, errLocked) {
		return true, readOwner(ctx, dir), nil
	}
	if err != nil {
		return false, nil, err
	}
	lock.release()
	return false, nil, nil
}
