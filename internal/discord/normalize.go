// Package discord is klbr-discord's transport: it keeps the Discord gateway
// (resume with the session's resume URL, a recorded gap notice when events
// may be missing, a clear exit on fatal close codes), normalizes messages
// into canonical inputs, admits them to klbr-core over ingress.sock with
// retry until acknowledged, and performs the outbox effects the core hands
// it (sends with a stable nonce and enforce_nonce, reactions, backreads),
// reporting honest receipts. It stores nothing: the core is the durable side.
// REST goes through discordgo; the gateway loop is its own (discordgo v0.29
// neither resumes at resume_gateway_url nor stops on fatal close codes).
package discord

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/klbr-dev/klbr/internal/ingress/ingressapi"
)

// MaxEventBytes bounds one gateway event's data.
const MaxEventBytes = 1 << 20

// Filter is the ingest configuration ([discord] in klbr.toml).
type Filter struct {
	BotID       string   // our own user id (from READY): never ingested, the target of mentions
	Channels    []string // guild channel filter; empty means all. DMs always pass.
	Directed    bool     // ingest only DMs and mentions
	IncludeBots bool     // bots and webhooks are excluded unless set
	Threads     map[string]string
}

// wireMessage is the part of Discord's message object the normalizer reads.
type wireMessage struct {
	ID        string `json:"id"`
	ChannelID string `json:"channel_id"`
	GuildID   string `json:"guild_id"`
	Author    struct {
		ID         string `json:"id"`
		Username   string `json:"username"`
		GlobalName string `json:"global_name"`
		Bot        bool   `json:"bot"`
	} `json:"author"`
	Content   string    `json:"content"`
	Timestamp time.Time `json:"timestamp"`
	WebhookID string    `json:"webhook_id"`
	Type      int       `json:"type"`
	Mentions  []struct {
		ID string `json:"id"`
	} `json:"mentions"`
	MessageReference *struct {
		MessageID string `json:"message_id"`
	} `json:"message_reference"`
	ReferencedMessage *struct {
		Author struct {
			ID string `json:"id"`
		} `json:"author"`
	} `json:"referenced_message"`
	Attachments []struct {
		ID          string `json:"id"`
		Filename    string `json:"filename"`
		ContentType string `json:"content_type"`
		Size        int64  `json:"size"`
		URL         string `json:"url"`
	} `json:"attachments"`
	Nonce json.RawMessage `json:"nonce"`
}

// ErrSkip marks a message the filter leaves out (not an error of the input).
var ErrSkip = errors.New("skipped")

// errNoContent is a skipped message with neither text nor attachments.
var errNoContent = fmt.Errorf("%w: no content (is the message content intent enabled?)", ErrSkip)

// Normalize turns a MESSAGE_CREATE event's data into a canonical input. It
// returns an error wrapping ErrSkip for what the filter leaves out (our own
// messages, bots, filtered channels, ambient chatter in directed mode), and
// another error for malformed data. Content is source text: a <system> tag
// or operator-looking text in it stays text.
func Normalize(data []byte, f Filter) (ingressapi.Message, error) {
	var m ingressapi.Message
	if len(data) > MaxEventBytes {
		return m, fmt.Errorf("message event is %d bytes, at most %d", len(data), MaxEventBytes)
	}
	if !utf8.Valid(data) {
		return m, errors.New("message event is not valid UTF-8")
	}
	var w wireMessage
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&w); err != nil {
		return m, fmt.Errorf("malformed message event: %w", err)
	}
	if !snowflake(w.ID) || !snowflake(w.ChannelID) || !snowflake(w.Author.ID) || (w.GuildID != "" && !snowflake(w.GuildID)) {
		return m, errors.New("message event: id, channel_id, author.id or guild_id is not a Discord id")
	}
	// 0 default, 19 reply; others are system messages (joins, pins, …).
	if w.Type != 0 && w.Type != 19 {
		return m, fmt.Errorf("%w: system message type %d", ErrSkip, w.Type)
	}
	if w.Author.ID == f.BotID {
		return m, fmt.Errorf("%w: our own message", ErrSkip)
	}
	if (w.Author.Bot || w.WebhookID != "") && !f.IncludeBots {
		return m, fmt.Errorf("%w: from a bot or webhook", ErrSkip)
	}
	m = ingressapi.Message{
		MessageID: w.ID, ChannelID: w.ChannelID, GuildID: w.GuildID, AuthorID: w.Author.ID,
		AuthorName: clipBytes(firstOf(w.Author.GlobalName, w.Author.Username), ingressapi.MaxNameBytes),
		Content:    w.Content, OccurredAt: w.Timestamp,
	}
	if m.OccurredAt.IsZero() {
		m.OccurredAt = snowflakeTime(w.ID)
	}
	switch {
	case w.GuildID == "":
		m.ChannelKind, m.Mode = ingressapi.KindDM, ingressapi.ModeDM
	default:
		m.ChannelKind, m.Mode = ingressapi.KindChannel, ingressapi.ModeAmbient
		if parent, ok := f.Threads[w.ChannelID]; ok {
			m.ChannelKind, m.ParentID = ingressapi.KindThread, parent
		}
		if len(f.Channels) > 0 && !slices.Contains(f.Channels, w.ChannelID) && !(m.ParentID != "" && slices.Contains(f.Channels, m.ParentID)) {
			return m, fmt.Errorf("%w: channel %s is not in discord.channels", ErrSkip, w.ChannelID)
		}
		if f.BotID != "" && (slices.ContainsFunc(w.Mentions, func(u struct {
			ID string `json:"id"`
		}) bool {
			return u.ID == f.BotID
		}) || (w.ReferencedMessage != nil && w.ReferencedMessage.Author.ID == f.BotID)) {
			m.Mode = ingressapi.ModeMention
		}
	}
	if f.Directed && m.Mode == ingressapi.ModeAmbient {
		return m, fmt.Errorf("%w: ambient, and discord.ingest is directed", ErrSkip)
	}
	if w.MessageReference != nil && snowflake(w.MessageReference.MessageID) {
		m.ReplyTo = w.MessageReference.MessageID
	}
	if len(m.Content) > ingressapi.MaxContentBytes {
		// Discord allows 4000 characters for some accounts; anything past the
		// admission bound is cut visibly, never silently.
		m.Content = clipBytes(m.Content, ingressapi.MaxContentBytes-64) + "\n[klbr-discord: message cut at the admission bound]"
	}
	for i, a := range w.Attachments {
		if i == ingressapi.MaxAttachments {
			break
		}
		if !snowflake(a.ID) || a.Size < 0 {
			continue
		}
		m.Attachments = append(m.Attachments, ingressapi.Attachment{ID: a.ID, Filename: clipBytes(a.Filename, ingressapi.MaxNameBytes),
			ContentType: clipBytes(a.ContentType, ingressapi.MaxNameBytes), Size: a.Size, URL: clipURL(a.URL)})
	}
	if m.Content == "" && len(m.Attachments) == 0 {
		return m, errNoContent
	}
	return m, nil
}

func firstOf(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// clipBytes cuts s to at most n bytes at a rune boundary.
func clipBytes(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

func clipURL(u string) string {
	if len(u) > ingressapi.MaxURLBytes || !strings.HasPrefix(u, "https://") && !strings.HasPrefix(u, "http://") {
		return ""
	}
	return u
}

// snowflake reports whether s is a Discord id: 1-20 digits (32 with room).
func snowflake(s string) bool {
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

// snowflakeTime is the creation time encoded in a Discord id.
func snowflakeTime(id string) time.Time {
	var n uint64
	for _, c := range []byte(id) {
		n = n*10 + uint64(c-'0')
	}
	return time.UnixMilli(int64(n>>22) + 1420070400000)
}
