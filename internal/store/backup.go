package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	sqlite3 "github.com/mattn/go-sqlite3"
)

// BackupStepPages is how many pages one step of an online backup copies
// (4 MiB at SQLite's default 4 KiB page). A step holds only a read lock:
// under WAL it never blocks klbr-core's writer, so the writer's stall bound
// during a backup is that of any reader: none. What a backup does hold back
// is the WAL reset: frames written while the backup reads its snapshot stay
// in the WAL until it ends (see docs/operating.md, "Backup").
const BackupStepPages = 1024

// BackupStats says what one online backup of the database copied.
type BackupStats struct {
	Pages       int           `json:"pages"`
	Steps       int           `json:"steps"`
	Bytes       int64         `json:"bytes"`
	Duration    time.Duration `json:"duration_ns"`
	LongestStep time.Duration `json:"longest_step_ns"`
	Schema      int           `json:"schema_version"` // the snapshot's
}

// ErrBackupExists is returned when the backup's destination file exists.
var ErrBackupExists = errors.New("backup destination exists")

const driverPlain = "klbr_sqlite3_plain"

var plainOnce sync.Once

// BackupDB copies the database of the data directory dir to the new file
// dest through SQLite's online backup API, stepPages at a time (0 means
// BackupStepPages), while klbr-core may be serving. The copy is one
// consistent snapshot: the source keeps one read transaction open across
// every step, so writes made meanwhile neither restart the backup nor show
// up half in it. dest is left a self-contained file (journal_mode DELETE).
func BackupDB(ctx context.Context, dir, dest string, stepPages int) (BackupStats, error) {
	registerDrivers()
	plainOnce.Do(func() { sql.Register(driverPlain, &sqlite3.SQLiteDriver{}) })
	if stepPages <= 0 {
		stepPages = BackupStepPages
	}
	var st BackupStats
	src := filepath.Join(dir, FileName)
	if _, err := os.Stat(src); err != nil {
		return st, fmt.Errorf("backup: %w", err)
	}
	// The copy holds all history: it is made 0600 before SQLite writes a
	// page of it (SQLite would create it 0644 less the umask, and gives its
	// journal the database file's mode).
	f, err := os.OpenFile(dest, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return st, fmt.Errorf("backup: %s: %w", dest, ErrBackupExists)
	} else if err != nil {
		return st, fmt.Errorf("backup: %w", err)
	}
	err = f.Chmod(0o600) // whatever the umask
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(dest)
		return st, fmt.Errorf("backup: %w", err)
	}
	sdb, err := sql.Open(driverRead, readDSN(src))
	if err != nil {
		return st, fmt.Errorf("backup: open source: %w", err)
	}
	defer sdb.Close()
	ddb, err := sql.Open(driverPlain, "file:"+dest)
	if err != nil {
		return st, fmt.Errorf("backup: open destination: %w", err)
	}
	defer ddb.Close()
	sc, err := sdb.Conn(ctx)
	if err != nil {
		return st, fmt.Errorf("backup: source: %w", err)
	}
	defer sc.Close()
	dc, err := ddb.Conn(ctx)
	if err != nil {
		return st, fmt.Errorf("backup: destination: %w", err)
	}
	defer dc.Close()
	// The copy is synced once, at the end (a backup cut short has no
	// manifest and is refused): per-step syncs would compete with the
	// writer's own fsyncs for the disk.
	for _, p := range []string{"PRAGMA synchronous = OFF", "PRAGMA journal_mode = OFF"} {
		if _, err := dc.ExecContext(ctx, p); err != nil {
			return st, fmt.Errorf("backup: destination: %s: %w", p, err)
		}
	}
	// The snapshot: one read transaction across every step.
	if _, err := sc.ExecContext(ctx, "BEGIN"); err != nil {
		return st, fmt.Errorf("backup: begin: %w", err)
	}
	defer sc.ExecContext(context.Background(), "ROLLBACK")
	var n int
	if err := sc.QueryRowContext(ctx, "SELECT count(*) FROM sqlite_schema").Scan(&n); err != nil {
		return st, fmt.Errorf("backup: read snapshot: %w", err)
	}
	if err := sc.QueryRowContext(ctx, "PRAGMA user_version").Scan(&st.Schema); err != nil {
		return st, fmt.Errorf("backup: read snapshot: %w", err)
	}
	start := time.Now()
	err = dc.Raw(func(d any) error {
		return sc.Raw(func(s any) error {
			b, err := d.(*sqlite3.SQLiteConn).Backup("main", s.(*sqlite3.SQLiteConn), "main")
			if err != nil {
				return err
			}
			defer b.Finish()
			for {
				if err := ctx.Err(); err != nil {
					return err
				}
				t := time.Now()
				done, err := b.Step(stepPages)
				st.LongestStep = max(st.LongestStep, time.Since(t))
				st.Steps++
				if err != nil {
					return err
				}
				if done {
					st.Pages = b.PageCount()
					return b.Finish()
				}
			}
		})
	})
	st.Duration = time.Since(start)
	if err != nil {
		os.Remove(dest)
		return st, fmt.Errorf("backup: %w", err)
	}
	if _, err := dc.ExecContext(ctx, "PRAGMA journal_mode = DELETE"); err != nil {
		return st, fmt.Errorf("backup: %w", err)
	}
	dc.Close()
	ddb.Close()
	f, err = os.Open(dest)
	if err != nil {
		return st, fmt.Errorf("backup: %w", err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return st, fmt.Errorf("backup: sync: %w", err)
	}
	fi, err := f.Stat()
	if err != nil {
		return st, err
	}
	st.Bytes = fi.Size()
	return st, nil
}
