package store

import (
	"context"
	"fmt"
)

// EffectFile is a file a send carries: an artifact, by digest.
type EffectFile struct {
	Filename    string `json:"filename"`
	ContentType string `json:"content_type,omitempty"`
	SHA256      string `json:"sha256"`
	Size        int64  `json:"size"`
}

// MaxEffectFiles is the most files one send carries (Discord's limit).
const MaxEffectFiles = 10

// addEffectFiles records the files of effect id, in order, and each as an
// artifact.
func (t *Tx) addEffectFiles(id int64, files []EffectFile) error {
	if len(files) > MaxEffectFiles {
		return fmt.Errorf("outbox: %d files; at most %d", len(files), MaxEffectFiles)
	}
	for i, f := range files {
		if !hexSHA256(f.SHA256) {
			return fmt.Errorf("outbox: file %d: %q is not a sha256", i, f.SHA256)
		}
		if _, err := t.exec(`INSERT INTO discord_effect_files (effect_id, position, filename, content_type, sha256, size) VALUES (?, ?, ?, ?, ?, ?)`,
			id, i, f.Filename, f.ContentType, f.SHA256, f.Size); err != nil {
			return fmt.Errorf("outbox: file %d: %w", i, err)
		}
		// An artifact no record produced (event_id NULL); it stays retained
		// until the storage retention collects it.
		if _, err := t.exec(`INSERT INTO artifacts (sha256, size, media_type, created_at) VALUES (?, ?, ?, ?)
			ON CONFLICT (sha256) DO UPDATE SET retention = 'retained', created_at = excluded.created_at`,
			f.SHA256, f.Size, f.ContentType, t.now.UnixMilli()); err != nil {
			return fmt.Errorf("outbox: file %d: %w", i, err)
		}
		if _, err := t.exec(`DELETE FROM tombstones WHERE kind = 'artifact' AND ref = ?`, f.SHA256); err != nil {
			return fmt.Errorf("outbox: file %d: %w", i, err)
		}
	}
	return nil
}

// EffectFiles lists the files of effect id, in order.
func (s *Store) EffectFiles(ctx context.Context, id int64) ([]EffectFile, error) {
	rows, err := s.rdb.QueryContext(ctx, `SELECT filename, content_type, sha256, size FROM discord_effect_files WHERE effect_id = ? ORDER BY position`, id)
	if err != nil {
		return nil, fmt.Errorf("effect files: %w", err)
	}
	defer rows.Close()
	var out []EffectFile
	for rows.Next() {
		var f EffectFile
		if err := rows.Scan(&f.Filename, &f.ContentType, &f.SHA256, &f.Size); err != nil {
			return nil, fmt.Errorf("effect files: %w", err)
		}
		out = append(out, f)
	}
	return out, rows.Err()
}
