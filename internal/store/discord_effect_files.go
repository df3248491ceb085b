package store

import (
	"context"
	"database/sql"
	"fmt"
)

// EffectFile is a file a send carries: an artifact, by digest.
type EffectFile struct {
	Filename    string `json:"filename"`
	ContentType string `json:"content_type,omitempty"`
	SHA256      string `json:"sha256"`
	Size        int64  `json:"size"`
	// AttachmentID is Discord's id of the file, once a send carrying it is
	// confirmed by Discord's answer ("" before, or when evidence settled it).
	AttachmentID string `json:"attachment_id,omitempty"`
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

const effectFilesQuery = `SELECT filename, content_type, sha256, size, attachment_id FROM discord_effect_files WHERE effect_id = ? ORDER BY position`

// EffectFiles lists the files of effect id, in order.
func (s *Store) EffectFiles(ctx context.Context, id int64) ([]EffectFile, error) {
	return scanEffectFiles(s.rdb.QueryContext(ctx, effectFilesQuery, id))
}

func (t *Tx) effectFiles(id int64) ([]EffectFile, error) {
	return scanEffectFiles(t.query(effectFilesQuery, id))
}

// setAttachmentIDs records Discord's attachment ids of a confirmed send's
// files, by position; ids past the files are ignored.
func (t *Tx) setAttachmentIDs(id int64, ids []string) error {
	for i, a := range ids {
		if i >= MaxEffectFiles {
			break
		}
		if !snowflakeID(a) {
			return fmt.Errorf("outbox: effect %d: attachment id %d is not a Discord id", id, i)
		}
		if _, err := t.exec(`UPDATE discord_effect_files SET attachment_id = ? WHERE effect_id = ? AND position = ?`, a, id, i); err != nil {
			return fmt.Errorf("outbox: effect %d: attachment ids: %w", id, err)
		}
	}
	return nil
}

// snowflakeID reports whether s is a Discord id: 1 to 20 digits.
func snowflakeID(s string) bool {
	if s == "" || len(s) > 20 {
		return false
	}
	for _, c := range []byte(s) {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

func scanEffectFiles(rows *sql.Rows, err error) ([]EffectFile, error) {
	if err != nil {
		return nil, fmt.Errorf("effect files: %w", err)
	}
	defer rows.Close()
	var out []EffectFile
	for rows.Next() {
		var f EffectFile
		if err := rows.Scan(&f.Filename, &f.ContentType, &f.SHA256, &f.Size, &f.AttachmentID); err != nil {
			return nil, fmt.Errorf("effect files: %w", err)
		}
		out = append(out, f)
	}
	return out, rows.Err()
}
