package ingress

import (
	"errors"
	"fmt"
	"io"

	"github.com/klbr-dev/klbr/internal/ingress/ingressapi"
	"github.com/klbr-dev/klbr/internal/strictjson"
)

// errTooLarge marks a body over the bound.
var errTooLarge = strictjson.ErrTooLarge

// decodeBody reads one JSON object of at most max bytes into v, strictly
// (package strictjson).
func decodeBody(r io.Reader, max int64, v any) error { return strictjson.ReadBody(r, max, v) }

// decodeJSON is the pure part of decodeBody, which the fuzz test drives.
func decodeJSON(body []byte, v any) error { return strictjson.Decode(body, v) }

// decodeAdmit decodes and checks an admit request: the batch bound and every
// message's fields. Per-message problems come back in bad (index → reason),
// so one bad message does not refuse its batch.
func decodeAdmit(body []byte) (req ingressapi.AdmitRequest, bad map[int]string, err error) {
	if err := decodeJSON(body, &req); err != nil {
		return req, nil, err
	}
	if len(req.Messages) == 0 {
		return req, nil, errors.New("messages is empty")
	}
	if len(req.Messages) > ingressapi.MaxBatch {
		return req, nil, fmt.Errorf("%d messages in one request; at most %d", len(req.Messages), ingressapi.MaxBatch)
	}
	bad = map[int]string{}
	for i, m := range req.Messages {
		if msg := checkMessage(m); msg != "" {
			bad[i] = msg
		}
	}
	return req, bad, nil
}

// checkMessage returns what is wrong with m, or "".
func checkMessage(m ingressapi.Message) string {
	if m.Mode == ingressapi.ModeGap {
		if len(m.MessageID) == 0 || len(m.MessageID) > ingressapi.MaxIDBytes {
			return "a gap notice needs an id of 1-32 bytes"
		}
		if m.Content == "" || len(m.Content) > ingressapi.MaxContentBytes {
			return "a gap notice needs a text"
		}
		return ""
	}
	for _, f := range []struct{ name, v string }{{"message_id", m.MessageID}, {"channel_id", m.ChannelID}, {"author_id", m.AuthorID}} {
		if !isSnowflake(f.v) {
			return fmt.Sprintf("%s %q is not a Discord id (1-%d digits)", f.name, clip(f.v), ingressapi.MaxIDBytes)
		}
	}
	for _, f := range []struct{ name, v string }{{"guild_id", m.GuildID}, {"parent_id", m.ParentID}, {"reply_to", m.ReplyTo}} {
		if f.v != "" && !isSnowflake(f.v) {
			return fmt.Sprintf("%s %q is not a Discord id", f.name, clip(f.v))
		}
	}
	switch m.ChannelKind {
	case ingressapi.KindDM, ingressapi.KindChannel, ingressapi.KindThread:
	default:
		return fmt.Sprintf("channel_kind %q is not dm, channel or thread", clip(m.ChannelKind))
	}
	switch m.Mode {
	case ingressapi.ModeDM, ingressapi.ModeMention, ingressapi.ModeAmbient:
	default:
		return fmt.Sprintf("mode %q is not dm, mention, ambient or gap", clip(m.Mode))
	}
	if (m.Mode == ingressapi.ModeDM) != (m.ChannelKind == ingressapi.KindDM) {
		return "mode dm goes with channel_kind dm, and only with it"
	}
	if len(m.AuthorName) > ingressapi.MaxNameBytes || len(m.ChannelName) > ingressapi.MaxNameBytes {
		return fmt.Sprintf("author_name and channel_name are at most %d bytes", ingressapi.MaxNameBytes)
	}
	if len(m.Content) > ingressapi.MaxContentBytes {
		return fmt.Sprintf("content is %d bytes, at most %d", len(m.Content), ingressapi.MaxContentBytes)
	}
	if m.Content == "" && len(m.Attachments) == 0 {
		return "a message with neither content nor attachments"
	}
	if len(m.Attachments) > ingressapi.MaxAttachments {
		return fmt.Sprintf("%d attachments, at most %d", len(m.Attachments), ingressapi.MaxAttachments)
	}
	for _, a := range m.Attachments {
		if !isSnowflake(a.ID) || len(a.Filename) > ingressapi.MaxNameBytes || len(a.ContentType) > ingressapi.MaxNameBytes ||
			len(a.URL) > ingressapi.MaxURLBytes || a.Size < 0 {
			return "an attachment's id, filename, content type, URL or size is out of bounds"
		}
	}
	return ""
}

// isSnowflake reports whether s is 1-32 ASCII digits.
func isSnowflake(s string) bool {
	if s == "" || len(s) > ingressapi.MaxIDBytes {
		return false
	}
	for _, c := range []byte(s) {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// clip shortens a value quoted in an error.
func clip(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}
