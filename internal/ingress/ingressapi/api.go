// Package ingressapi holds the wire types of the ingress protocol (HTTP/1.1 +
// JSON over ingress.sock, under /v1; DESIGN.md §4) and its one client, which
// klbr-discord uses. It imports nothing of the core, so the transport binary
// links no database.
package ingressapi

import "time"

// Bounds of the protocol. Every decoder on either side enforces them.
const (
	MaxRequestBytes  = 4 << 20  // one request body
	MaxResponseBytes = 16 << 20 // one response body
	MaxBatch         = 256      // messages in one admit request
	MaxContentBytes  = 64 << 10 // one message's text (the admission bound)
	MaxIDBytes       = 32       // a Discord snowflake, with room
	MaxNameBytes     = 256      // author and channel names
	MaxAttachments   = 10       // per message, as Discord allows
	// MaxSendChars is Discord's limit on a message's content, counted as
	// Discord counts it: in Unicode code points, not bytes.
	MaxSendChars = 2000
	MaxURLBytes  = 2048
	MaxClaim     = 64  // effects handed over in one claim
	MaxReadLimit = 100 // messages in one backread (Discord's page)
	MaxClaimWait = 30 * time.Second
)

// Message modes: how a message reached the agent.
const (
	ModeDM      = "dm"      // a direct message: demands attention
	ModeMention = "mention" // mentions the bot or replies to it: demands attention
	ModeAmbient = "ambient" // guild chatter: may be left alone
	ModeGap     = "gap"     // a notice that events may be missing (a failed resume)
)

// Channel kinds.
const (
	KindDM      = "dm"
	KindChannel = "channel"
	KindThread  = "thread"
)

// Message is one normalized Discord message (or gap notice), as the
// transport admits it. Text is source text: nothing in it carries authority.
type Message struct {
	MessageID   string       `json:"message_id"`
	ChannelID   string       `json:"channel_id"`
	ChannelKind string       `json:"channel_kind"`
	GuildID     string       `json:"guild_id,omitempty"`
	ParentID    string       `json:"parent_id,omitempty"` // a thread's channel
	ChannelName string       `json:"channel_name,omitempty"`
	AuthorID    string       `json:"author_id"`
	AuthorName  string       `json:"author_name"`
	Mode        string       `json:"mode"`
	Content     string       `json:"content"`
	ReplyTo     string       `json:"reply_to,omitempty"`
	OccurredAt  time.Time    `json:"occurred_at"`
	Attachments []Attachment `json:"attachments,omitempty"`
	// OutOfOrder says older messages of the channel may still be on their
	// way (a catch-up of it has not been admitted yet): the message is
	// admitted but does not move the conversation's backfill cursor.
	OutOfOrder bool `json:"out_of_order,omitempty"`
}

// Attachment is attachment metadata; the bytes are fetched later, bounded,
// if at all. A URL is not a promise that the bytes stay available.
type Attachment struct {
	ID          string `json:"id"`
	Filename    string `json:"filename"`
	ContentType string `json:"content_type,omitempty"`
	Size        int64  `json:"size"`
	URL         string `json:"url"`
}

// AdmitRequest is POST /v1/inputs.
type AdmitRequest struct {
	Messages []Message `json:"messages"`
}

// AdmitResult answers one message of an admit request. Error set means the
// message was refused for good (invalid): retrying it cannot help.
type AdmitResult struct {
	InputID      int64      `json:"input_id,omitempty"`
	EventID      int64      `json:"event_id,omitempty"`
	Duplicate    bool       `json:"duplicate,omitempty"`
	Conversation string     `json:"conversation,omitempty"` // alias
	ItemID       int64      `json:"item_id,omitempty"`
	Error        *ErrorBody `json:"error,omitempty"`
}

// AdmitResponse answers an admit request once every admitted message is committed.
type AdmitResponse struct {
	Results []AdmitResult `json:"results"`
}

// HelloRequest is POST /v1/transport/hello, sent by a transport when it
// starts: every effect still attempting was left by a transport that died
// mid-attempt, and comes back in the answer for reconciliation.
type HelloRequest struct {
	Instance string `json:"instance"`
	BotID    string `json:"bot_id,omitempty"`
}

// HelloResponse lists the effects to reconcile (the transport looks for
// evidence and reports confirmed or unknown) and the conversations the core
// knows with the newest message it has of each, from which a transport that
// just started fetches what arrived while none was connected.
type HelloResponse struct {
	Reconcile     []Effect          `json:"reconcile"`
	Conversations []ConversationRef `json:"conversations"`
	// Fence is this transport's fencing token: every claim, receipt and
	// read answer carries it (FenceHeader), and klbr-core refuses those of
	// any other token, so two transports can never both deliver.
	Fence string `json:"fence"`
	// Fetches are attachments admitted earlier whose fetch has no outcome
	// (the transport that would have fetched them ended): the newest first,
	// at most MaxPendingFetches.
	Fetches []PendingFetch `json:"fetches,omitempty"`
}

// FenceHeader carries a transport's fencing token.
const FenceHeader = "X-Klbr-Fence"

// ConversationRef is a known conversation and where a restarted transport
// reads its history from.
type ConversationRef struct {
	ChannelID string `json:"channel_id"`
	Kind      string `json:"kind"`
	GuildID   string `json:"guild_id,omitempty"`
	ParentID  string `json:"parent_id,omitempty"`
	Name      string `json:"name,omitempty"`
	// LastMessageID is what a restarted transport reads history after: the
	// newest message admitted from the conversation (never one of our own
	// sends, which can be newer than a message not yet admitted).
	LastMessageID string `json:"last_message_id,omitempty"`
}

// MaxBackfillConversations bounds the conversations a hello hands over,
// the most recently active first.
const MaxBackfillConversations = 200

// ClaimRequest is POST /v1/effects/claim: a long poll for work. Gateway
// carries the transport's gateway state for klbr-core's /metrics.
type ClaimRequest struct {
	Limit   int           `json:"limit"`
	WaitMS  int           `json:"wait_ms"`
	Gateway *GatewayStats `json:"gateway,omitempty"`
}

// GatewayStats is the transport's gateway state since it started.
type GatewayStats struct {
	Connected bool   `json:"connected"`
	Sessions  uint64 `json:"sessions"` // identifies (new sessions)
	Resumes   uint64 `json:"resumes"`
	Gaps      uint64 `json:"gaps"` // gap notices: resumes that failed
	Admitted  uint64 `json:"admitted"`
	Dropped   uint64 `json:"dropped"` // refused for good by the core (invalid)
	// GapRecoveries counts deaf connections the probe found (channels moved
	// without a delivery), each dropped, resumed and backfilled.
	GapRecoveries uint64 `json:"gap_recoveries"`
	ThreadJoins   uint64 `json:"thread_joins"` // new threads and forum posts joined
	// InvalidRequests is REST answers 401, 403 or 429 in the last 10 minutes.
	InvalidRequests uint64 `json:"invalid_requests"`
	// RateLimited counts live messages not admitted for a flood (past the
	// per-author or per-channel rate); RateLimitBursts the notices that
	// recorded them, one per burst.
	RateLimited     uint64 `json:"rate_limited,omitempty"`
	RateLimitBursts uint64 `json:"rate_limit_bursts,omitempty"`
}

// ClaimResponse hands over effects (now attempting) and reads to perform,
// and held effects to tell the operator of.
type ClaimResponse struct {
	Effects []Effect `json:"effects"`
	Reads   []Read   `json:"reads"`
	// Notify are held effects the operator ([discord] operator_user_id,
	// notify_held) has not been told of yet: the transport DMs them with
	// Release and Drop buttons and reports each with POST
	// /v1/held/{id}/notified.
	Notify []HeldNotify `json:"notify,omitempty"`
}

// HeldNotify is a held effect to tell the operator of.
type HeldNotify struct {
	Effect
	Conversation string `json:"conversation"` // alias
	Reason       string `json:"held_reason"`
	Operator     string `json:"operator_user_id"`
}

// HeldNotified is POST /v1/held/{id}/notified: the notice's outcome.
type HeldNotified struct {
	MessageID string `json:"message_id,omitempty"` // the DM's message; empty with Error
	Error     string `json:"error,omitempty"`
}

// HeldDecision is POST /v1/held/{id}/decide: the operator pressed a button
// of the notice. klbr-core honors it only when UserID is the configured
// operator.
type HeldDecision struct {
	Decision string `json:"decision"` // release or drop
	UserID   string `json:"user_id"`
}

// HeldDecided answers a decision: the effect as it is now.
type HeldDecided struct {
	ID    int64  `json:"id"`
	State string `json:"state"`
	Kind  string `json:"kind"`
}

// Effect is an outbox effect the transport performs.
type Effect struct {
	ID             int64  `json:"id"`
	Kind           string `json:"kind"` // send, react
	State          string `json:"state"`
	ChannelID      string `json:"channel_id"`
	Nonce          string `json:"nonce"`
	Text           string `json:"text,omitempty"`
	Emoji          string `json:"emoji,omitempty"`
	Target         string `json:"target_message_id,omitempty"`
	ReplyReference bool   `json:"reply_reference"`
	Attempts       int64  `json:"attempts"`
	// ClaimedAt is when the latest attempt was handed out: a message of
	// ours with the same text from after it is evidence for a send.
	ClaimedAt time.Time `json:"claimed_at,omitzero"`
	// Files go with a send (read each with Client.EffectFile).
	Files []EffectFile `json:"files,omitempty"`
}

// Receipt is POST /v1/effects/{id}/receipt: what happened to an attempt.
// State is confirmed, failed, unknown, or pending for a retry that cannot
// have delivered anything (a rate limit answered before the send).
type Receipt struct {
	State     string `json:"state"`
	MessageID string `json:"message_id,omitempty"`
	ErrorCode string `json:"error_code,omitempty"`
	Error     string `json:"error,omitempty"`
	Evidence  string `json:"evidence,omitempty"`
	// Files are a confirmed send's files as Discord made them, in the order
	// they were sent (at most MaxSendFiles).
	Files []SentFile `json:"files,omitempty"`
}

// SentFile is a file of a confirmed send as the message Discord answered
// with has it.
type SentFile struct {
	AttachmentID string `json:"attachment_id"`
	Filename     string `json:"filename"`
	Size         int64  `json:"size"`
}

// ReceiptResponse is the effect as recorded.
type ReceiptResponse struct {
	ID     int64  `json:"id"`
	State  string `json:"state"`
	Repeat bool   `json:"repeat,omitempty"`
}

// Read is a backread or list the core asks the transport to perform. It is
// not durable: a transport that dies drops it and the asking cell gets an error.
type Read struct {
	ID        int64  `json:"id"`
	ChannelID string `json:"channel_id"`
	Limit     int    `json:"limit"`
	Before    string `json:"before,omitempty"`
	After     string `json:"after,omitempty"`
}

// ReadAnswer is POST /v1/reads/{id}.
type ReadAnswer struct {
	Messages []HistoryMessage `json:"messages"`
	Error    string           `json:"error,omitempty"`
}

// HistoryMessage is one message of a backread. Reading history is not
// accepting work: these are not inputs and not attention items.
type HistoryMessage struct {
	MessageID  string    `json:"message_id"`
	AuthorID   string    `json:"author_id"`
	AuthorName string    `json:"author_name"`
	Bot        bool      `json:"bot,omitempty"`
	Content    string    `json:"content"`
	ReplyTo    string    `json:"reply_to,omitempty"`
	Nonce      string    `json:"nonce,omitempty"`
	OccurredAt time.Time `json:"occurred_at"`
}

// Error is a non-2xx answer.
type Error struct {
	Error ErrorBody `json:"error"`
}

// ErrorBody says what went wrong; Code is stable.
type ErrorBody struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Error codes.
const (
	CodeInvalid   = "invalid"
	CodeForbidden = "forbidden"
	CodeNotFound  = "not_found"
	CodeConflict  = "conflict"
	CodeDraining  = "draining"
	// CodeFenced: another transport is the data directory's sender (a
	// hello), or this one's token is stale (claims: say hello again).
	CodeFenced      = "fenced"
	CodeTooLarge    = "too_large"
	CodeInternal    = "internal"
	CodeUnavailable = "unavailable"
)
