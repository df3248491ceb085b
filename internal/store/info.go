package store

import (
	"context"
	"database/sql"
	"fmt"
)

// RuntimeInfo describes the SQLite library klbr-core is linked with.
type RuntimeInfo struct {
	Version        string   `json:"version"`
	SourceID       string   `json:"source_id"`
	CompileOptions []string `json:"compile_options"`
}

// ReadRuntimeInfo reports the linked SQLite without touching any data file.
func ReadRuntimeInfo(ctx context.Context) (RuntimeInfo, error) {
	registerDrivers()
	db, err := sql.Open(driverWrite, ":memory:")
	if err != nil {
		return RuntimeInfo{}, err
	}
	defer db.Close()
	return readRuntimeInfo(ctx, db)
}

func readRuntimeInfo(ctx context.Context, db *sql.DB) (RuntimeInfo, error) {
	var info RuntimeInfo
	if err := db.QueryRowContext(ctx, "SELECT sqlite_version(), sqlite_source_id()").Scan(&info.Version, &info.SourceID); err != nil {
		return info, fmt.Errorf("read sqlite version: %w", err)
	}
	rows, err := db.QueryContext(ctx, "PRAGMA compile_options")
	if err != nil {
		return info, fmt.Errorf("read compile options: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var opt string
		if err := rows.Scan(&opt); err != nil {
			return info, err
		}
		info.CompileOptions = append(info.CompileOptions, opt)
	}
	return info, rows.Err()
}
