package store

import (
	"database/sql"
	"fmt"
	"sync"

	sqlite3 "github.com/mattn/go-sqlite3"
)

// Driver names registered with database/sql; one for the writer, one for readers.
const (
	driverWrite = "klbr_sqlite3_rw"
	driverRead  = "klbr_sqlite3_ro"
)

// BusyTimeoutMillis is how long a connection waits on a lock before SQLITE_BUSY.
const BusyTimeoutMillis = 5000

// pragmas are every per-connection setting klbr relies on, in one place.
// journal_mode is persistent in the file; the others are per connection.
func pragmas(readOnly bool) []string {
	p := []string{
		"PRAGMA journal_mode = WAL",
		"PRAGMA synchronous = FULL",
		"PRAGMA foreign_keys = ON",
		fmt.Sprintf("PRAGMA busy_timeout = %d", BusyTimeoutMillis),
	}
	if readOnly {
		p = append(p, "PRAGMA query_only = ON")
	} else {
		// The checkpoint policy (checkpoint.go).
		p = append(p, fmt.Sprintf("PRAGMA wal_autocheckpoint = %d", WALAutocheckpointPages),
			fmt.Sprintf("PRAGMA journal_size_limit = %d", JournalSizeLimitBytes))
	}
	return p
}

var registerOnce sync.Once

func registerDrivers() {
	registerOnce.Do(func() {
		for _, d := range []struct {
			name     string
			readOnly bool
		}{{driverWrite, false}, {driverRead, true}} {
			ps := pragmas(d.readOnly)
			sql.Register(d.name, &sqlite3.SQLiteDriver{
				ConnectHook: func(c *sqlite3.SQLiteConn) error {
					for _, p := range ps {
						if _, err := c.Exec(p, nil); err != nil {
							return fmt.Errorf("sqlite: %s: %w", p, err)
						}
					}
					return nil
				},
			})
		}
	})
}

// dsn builds the writer's connection string. _txlock=immediate makes every
// transaction take the write lock at BEGIN, so a batch never upgrades mid-way.
func dsn(path string) string {
	return "file:" + path + "?_txlock=immediate"
}

// readDSN builds the readers' connection string: deferred transactions,
// which under WAL read a snapshot and never take the write lock.
func readDSN(path string) string {
	return "file:" + path + "?_txlock=deferred"
}
