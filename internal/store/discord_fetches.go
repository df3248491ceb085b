package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
)

// Errors of attachment fetch outcomes.
var (
	ErrUnknownAttachment = errors.New("unknown attachment")
	ErrFetchSettled      = errors.New("the attachment's fetch has an outcome already")
)

// AttachmentTarget is an admitted attachment whose bytes may be stored.
type AttachmentTarget struct {
	InputID     int64
	EventID     int64 // the admission's event: the artifact's record
	ID          string
	Filename    string
	ContentType string
	Size        int64 // as Discord announced it
	URL         string
	State       string // AttachmentPending, AttachmentFetched or AttachmentFailed
	SHA256      string // fetched: the artifact
	ErrorCode   string // failed: why
}

// AttachmentTarget finds attachment id of the Discord message messageID
// admitted into session.
func (s *Store) AttachmentTarget(ctx context.Context, session, messageID, id string) (AttachmentTarget, error) {
	var t AttachmentTarget
	var state, sha, code sql.NullString
	err := s.rdb.QueryRowContext(ctx, `SELECT m.input_id, i.event_id, json_extract(j.value, '$.id'),
			COALESCE(json_extract(j.value, '$.filename'), ''), COALESCE(json_extract(j.value, '$.content_type'), ''),
			COALESCE(json_extract(j.value, '$.size'), 0), COALESCE(json_extract(j.value, '$.url'), ''), f.state, f.sha256, f.error_code
		FROM discord_messages m JOIN inputs i ON i.id = m.input_id, json_each(m.attachments) j
		LEFT JOIN discord_attachment_fetches f ON f.input_id = m.input_id AND f.attachment_id = json_extract(j.value, '$.id')
		WHERE i.session_id = ? AND m.message_id = ? AND json_extract(j.value, '$.id') = ?`, session, messageID, id).
		Scan(&t.InputID, &t.EventID, &t.ID, &t.Filename, &t.ContentType, &t.Size, &t.URL, &state, &sha, &code)
	if errors.Is(err, sql.ErrNoRows) {
		return t, ErrUnknownAttachment
	}
	if err != nil {
		return t, fmt.Errorf("attachment: %w", err)
	}
	t.State = AttachmentPending
	if state.Valid {
		t.State, t.SHA256, t.ErrorCode = state.String, sha.String, code.String
	}
	return t, nil
}

// AttachmentOutcome is how the fetch of an attachment ended.
type AttachmentOutcome struct {
	State     string // AttachmentFetched or AttachmentFailed
	SHA256    string // fetched: the artifact
	Size      int64
	MediaType string // fetched: the artifact's media type
	ErrorCode string // failed: too_large, timeout, expired, budget, http_NNN, …
	Detail    string
}

// RecordAttachmentFetch records the one outcome of t's fetch (a second is
// ErrFetchSettled). Fetched content is recorded as an artifact of the
// message's admission.
func (tx *Tx) RecordAttachmentFetch(t AttachmentTarget, o AttachmentOutcome) error {
	var sha any
	switch o.State {
	case AttachmentFetched:
		if !hexSHA256(o.SHA256) {
			return fmt.Errorf("attachment fetch: %q is not a sha256", o.SHA256)
		}
		sha = o.SHA256
	case AttachmentFailed:
		o.Size = 0
	default:
		return fmt.Errorf("attachment fetch: state %q", o.State)
	}
	res, err := tx.exec(`INSERT INTO discord_attachment_fetches (input_id, attachment_id, state, sha256, size, error_code, detail, at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING`,
		t.InputID, t.ID, o.State, sha, o.Size, clipName(o.ErrorCode, 64), clipName(o.Detail, 512), tx.now.UnixMilli())
	if err != nil {
		return fmt.Errorf("attachment fetch: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return ErrFetchSettled
	}
	if o.State == AttachmentFetched {
		return tx.recordArtifact(o.SHA256, o.Size, o.MediaType, t.EventID)
	}
	return nil
}

// PendingFetch is an attachment admitted whose fetch has no outcome.
type PendingFetch struct {
	MessageID   string `json:"message_id"`
	ChannelID   string `json:"channel_id"`
	ID          string `json:"id"`
	Filename    string `json:"filename"`
	ContentType string `json:"content_type,omitempty"`
	Size        int64  `json:"size"`
	URL         string `json:"url"`
}

// PendingFetches lists up to limit attachments of session's messages
// without a fetch outcome, the newest messages first: a transport that
// starts fetches them (their fetcher died with the previous one).
func (s *Store) PendingFetches(ctx context.Context, session string, limit int) ([]PendingFetch, error) {
	rows, err := s.rdb.QueryContext(ctx, `SELECT m.message_id, c.channel_id, j.value
		FROM discord_messages m JOIN inputs i ON i.id = m.input_id
		JOIN discord_conversations c ON c.id = m.conversation_id, json_each(m.attachments) j
		WHERE i.session_id = ? AND m.attachments <> '[]'
		  AND NOT EXISTS (SELECT 1 FROM discord_attachment_fetches f WHERE f.input_id = m.input_id AND f.attachment_id = json_extract(j.value, '$.id'))
		ORDER BY m.input_id DESC, j.key LIMIT ?`, session, limit)
	if err != nil {
		return nil, fmt.Errorf("pending fetches: %w", err)
	}
	defer rows.Close()
	var out []PendingFetch
	for rows.Next() {
		var p PendingFetch
		var raw string
		if err := rows.Scan(&p.MessageID, &p.ChannelID, &raw); err != nil {
			return nil, fmt.Errorf("pending fetches: %w", err)
		}
		if json.Unmarshal([]byte(raw), &p) != nil || p.ID == "" {
			continue
		}
		out = append(out, p)
	}
	return out, rows.Err()
}
