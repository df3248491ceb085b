package store

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// OpenReader opens the database of dir for reading only, without its
// owner lock, so that `klbr-core check` can read a data directory that
// klbr-core serves. Under WAL its reads never block the writer. Every
// write through it fails with ErrClosed; it does not migrate.
func OpenReader(ctx context.Context, dir string) (*Store, error) {
	registerDrivers()
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	path := filepath.Join(dir, FileName)
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	rdb, err := sql.Open(driverRead, readDSN(path))
	if err != nil {
		return nil, fmt.Errorf("store: open reader: %w", err)
	}
	rdb.SetMaxOpenConns(2)
	if err := rdb.PingContext(ctx); err != nil {
		rdb.Close()
		return nil, fmt.Errorf("store: open reader: %w", err)
	}
	closed := make(chan struct{})
	close(closed)
	s := &Store{dir: dir, clock: time.Now, rdb: rdb, readOnly: true, closing: closed,
		watchers: map[string]map[*watcher]struct{}{}, control: map[string]int64{}}
	s.info, _ = readRuntimeInfo(ctx, rdb)
	return s, nil
}
