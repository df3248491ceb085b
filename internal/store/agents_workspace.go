package store

import (
	"context"
	"database/sql"
	"fmt"
)

// ChildWorkspaceDirs returns the directory of every child's own workspace
// (a worktree or copy) its job's spec names, ended children included.
func (s *Store) ChildWorkspaceDirs(ctx context.Context) (map[string]bool, error) {
	rows, err := s.rdb.QueryContext(ctx, `SELECT json_extract(spec, '$.workspace.dir') FROM jobs
		WHERE kind = 'child' AND json_extract(spec, '$.workspace.mode') = 'worktree'`)
	if err != nil {
		return nil, fmt.Errorf("child workspaces: %w", err)
	}
	defer rows.Close()
	out := map[string]bool{}
	for rows.Next() {
		var d sql.NullString
		if err := rows.Scan(&d); err != nil {
			return nil, err
		}
		if d.Valid {
			out[d.String] = true
		}
	}
	return out, rows.Err()
}
