package store

import (
	"encoding/json"
	"strconv"
	"unicode/utf8"
)

// Bounds of the attachment metadata read back for the model and cells (the
// ingress door bounds what is stored; these bound what is read anyway).
const (
	maxAttachmentsShown  = 10
	maxAttachmentNameLen = 256
)

// Attachment is a Discord attachment's metadata as the model and cells see
// it: Alias (a1, a2, … in the message's order) names it within its message.
// Its CDN URL stays in the store: it is a link that expires, not a handle.
type Attachment struct {
	Alias       string `json:"alias"`
	ID          string `json:"id"`
	Filename    string `json:"filename"`
	ContentType string `json:"content_type,omitempty"`
	Size        int64  `json:"size"`
	// State is the fetch of its bytes: pending (not ended yet), fetched
	// (SHA256 names the artifact) or failed (Error says why; final).
	State  string `json:"state"`
	SHA256 string `json:"sha256,omitempty"`
	Error  string `json:"error,omitempty"`
}

// Fetch states of an attachment.
const (
	AttachmentPending = "pending"
	AttachmentFetched = "fetched"
	AttachmentFailed  = "failed"
)

// attachmentsExpr reads the attachments column of discord_messages m with
// each attachment's fetch outcome folded in (under "fetch"), for
// parseAttachments. json() keeps the outcome an object: a subquery's value
// loses its JSON subtype.
const attachmentsExpr = `(SELECT json_group_array(json_set(j.value, '$.fetch',
		json((SELECT json_object('state', f.state, 'sha256', f.sha256, 'error', f.error_code) FROM discord_attachment_fetches f
		 WHERE f.input_id = m.input_id AND f.attachment_id = json_extract(j.value, '$.id')))))
	FROM json_each(m.attachments) j)`

// parseAttachments reads a discord_messages.attachments column: at most
// maxAttachmentsShown, names clipped, anything malformed left out.
func parseAttachments(raw string) []Attachment {
	if raw == "" || raw == "[]" || len(raw) > 64<<10 {
		return nil
	}
	var in []struct {
		ID          string `json:"id"`
		Filename    string `json:"filename"`
		ContentType string `json:"content_type"`
		Size        int64  `json:"size"`
		Fetch       *struct {
			State  string `json:"state"`
			SHA256 string `json:"sha256"`
			Error  string `json:"error"`
		} `json:"fetch"`
	}
	if json.Unmarshal([]byte(raw), &in) != nil {
		return nil
	}
	var out []Attachment
	for i, a := range in {
		if i == maxAttachmentsShown {
			break
		}
		out = append(out, Attachment{Alias: "a" + strconv.Itoa(i+1), ID: clipName(a.ID, 32), Filename: clipName(a.Filename, maxAttachmentNameLen),
			ContentType: clipName(a.ContentType, 128), Size: max(a.Size, 0), State: AttachmentPending})
		if f := a.Fetch; f != nil {
			switch {
			case f.State == AttachmentFetched && hexSHA256(f.SHA256):
				out[i].State, out[i].SHA256 = AttachmentFetched, f.SHA256
			case f.State == AttachmentFailed:
				out[i].State, out[i].Error = AttachmentFailed, clipName(f.Error, 64)
			}
		}
	}
	return out
}

func clipName(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[:n]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}

func hexSHA256(s string) bool {
	if len(s) != 64 {
		return false
	}
	for _, c := range s {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}
