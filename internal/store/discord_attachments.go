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
}

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
			ContentType: clipName(a.ContentType, 128), Size: max(a.Size, 0)})
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
