package ingress

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/klbr-dev/klbr/internal/artifacts"
	"github.com/klbr-dev/klbr/internal/store"
)

// Bounds of discord.attachment, the cell's read of an attachment's bytes.
const (
	// MaxAttachmentChunk is the most one request answers: base64 of it
	// (342 KiB) stays under the worker protocol's bound on a result.
	MaxAttachmentChunk = 256 << 10
	// MaxAttachmentArgsBytes bounds the request's arguments.
	MaxAttachmentArgsBytes = 1 << 10
	// attachmentPoll is how often a read waiting for a fetch looks again.
	attachmentPoll = 200 * time.Millisecond
)

// attachmentArgs is a cell's discord.attachment request: an attachment of a
// message, by the ids the cell was shown (item.attachments), and where to
// read. Never an artifact digest or a path: the host finds the artifact
// itself, and only for a message admitted into the cell's own session.
type attachmentArgs struct {
	MessageID    string `json:"message_id"`
	AttachmentID string `json:"attachment_id"`
	Offset       int64  `json:"offset"`
	Length       int    `json:"length"`
}

// decodeAttachmentArgs decodes and checks a discord.attachment request.
func decodeAttachmentArgs(raw []byte) (attachmentArgs, error) {
	var a attachmentArgs
	if len(raw) > MaxAttachmentArgsBytes {
		return a, fmt.Errorf("arguments of %d bytes; at most %d", len(raw), MaxAttachmentArgsBytes)
	}
	if err := decodeJSON(raw, &a); err != nil {
		return a, err
	}
	switch {
	case !validID(a.MessageID):
		return a, errors.New("message_id is a Discord message id (the item's message_id)")
	case !validID(a.AttachmentID):
		return a, errors.New("attachment_id is a Discord attachment id (from item.attachments)")
	case a.Offset < 0:
		return a, errors.New("offset must not be negative")
	case a.Length < 0 || a.Length > MaxAttachmentChunk:
		return a, fmt.Errorf("length must be 0..%d (0: as much as one answer holds)", MaxAttachmentChunk)
	}
	if a.Length == 0 {
		a.Length = MaxAttachmentChunk
	}
	return a, nil
}

// AttachmentChunk answers discord.attachment: Data holds Size bytes' worth
// from Offset (base64 in JSON); EOF says nothing follows.
type AttachmentChunk struct {
	MessageID    string `json:"message_id"`
	AttachmentID string `json:"attachment_id"`
	Filename     string `json:"filename"`
	ContentType  string `json:"content_type,omitempty"`
	SHA256       string `json:"sha256"`
	Size         int64  `json:"size"`
	Offset       int64  `json:"offset"`
	Data         []byte `json:"data"`
	EOF          bool   `json:"eof"`
}

// attachment answers discord.attachment: a chunk of an attachment of a
// message admitted into the cell's session. One still being fetched is
// waited for (bounded by AttachmentWait); a failed one is refused with the
// recorded reason.
func (o *Ops) attachment(ctx context.Context, session string, raw json.RawMessage) (json.RawMessage, error) {
	a, err := decodeAttachmentArgs(raw)
	if err != nil {
		return nil, refuse("invalid", "discord.attachment: %v", err)
	}
	t, err := o.fetchedAttachment(ctx, session, a)
	if err != nil {
		return nil, err
	}
	arts := o.server.artifacts()
	if arts == nil {
		return nil, refuse("unavailable", "klbr-core keeps no artifacts here: attachment bytes cannot be read")
	}
	p, err := arts.Path(t.SHA256)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil, refuse("gone", "attachment %s was fetched, but its bytes have been removed since (storage gc)", a.AttachmentID)
	}
	if err != nil {
		return nil, fmt.Errorf("discord.attachment: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("discord.attachment: %w", err)
	}
	size := fi.Size()
	if a.Offset > size {
		return nil, refuse("invalid", "offset %d is past the attachment's %d bytes", a.Offset, size)
	}
	buf := make([]byte, min(int64(a.Length), size-a.Offset))
	n, err := f.ReadAt(buf, a.Offset)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("discord.attachment: %w", err)
	}
	return json.Marshal(AttachmentChunk{MessageID: a.MessageID, AttachmentID: t.ID, Filename: t.Filename, ContentType: t.ContentType,
		SHA256: t.SHA256, Size: size, Offset: a.Offset, Data: buf[:n], EOF: a.Offset+int64(n) >= size})
}

// fetchedAttachment finds the attachment in the cell's session and waits,
// bounded, for its fetch to end.
func (o *Ops) fetchedAttachment(ctx context.Context, session string, a attachmentArgs) (store.AttachmentTarget, error) {
	wait := o.AttachmentWait
	if wait <= 0 {
		wait = 30 * time.Second
	}
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	for {
		t, err := o.store.AttachmentTarget(ctx, session, a.MessageID, a.AttachmentID)
		if errors.Is(err, store.ErrUnknownAttachment) {
			// Not one of this session's messages, or no such attachment:
			// the same answer either way.
			return t, refuse("not_found", "no attachment %s on a message %s this agent was shown", a.AttachmentID, a.MessageID)
		}
		if err != nil {
			return t, err
		}
		switch t.State {
		case store.AttachmentFetched:
			return t, nil
		case store.AttachmentFailed:
			return t, refuse("unavailable", "attachment %s (%q) was not fetched: %s; it is not tried again", t.ID, t.Filename, t.ErrorCode)
		}
		if !o.server.Connected() {
			return t, refuse("unavailable", "attachment %s (%q) is not fetched yet and klbr-discord is not connected; try again later", t.ID, t.Filename)
		}
		select {
		case <-time.After(attachmentPoll):
		case <-deadline.C:
			return t, refuse("pending", "attachment %s (%q) is still being fetched; try again shortly", t.ID, t.Filename)
		case <-ctx.Done():
			return t, ctx.Err()
		}
	}
}

// artifacts is the store fetched attachments and sent files are in (nil:
// none).
func (s *Server) artifacts() *artifacts.Store {
	if s.cfg.Artifacts == nil {
		return nil
	}
	return s.cfg.Artifacts()
}
