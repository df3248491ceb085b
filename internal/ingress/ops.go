package ingress

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/klbr-dev/klbr/internal/hooks"
	"github.com/klbr-dev/klbr/internal/ingress/ingressapi"
	"github.com/klbr-dev/klbr/internal/store"
	"github.com/klbr-dev/klbr/internal/workbench"
	"github.com/klbr-dev/klbr/internal/worker"
)

// Bounds of the discord.* operations.
const (
	// MaxSendChars is Discord's limit on a message's content, counted as
	// Discord counts it: in Unicode code points, not bytes (1,999 CJK
	// characters are one message; 2,001 are refused with 50035).
	MaxSendChars = ingressapi.MaxSendChars
	MaxEmojiLen  = 64
	MaxNoteBytes = 1024
)

// Reviewer is delivery.review (package hooks).
type Reviewer interface {
	ReviewAt(ctx context.Context, session string, pin *store.Pin, in hooks.ReviewInput) hooks.Decision
}

// Ops answers the discord.* host requests of cells: current, conversations,
// history, send, react, mark, receipt, attachment.
type Ops struct {
	store  *store.Store
	review Reviewer
	server *Server
	// Workspace is where a session's cell works (files of a send are read
	// beneath it, through celltree); nil: sends carry no files.
	Workspace func(ctx context.Context, session string) (string, error)
	// SendWait bounds how long send waits for the transport's receipt before
	// answering with the effect still pending (0: 10 s).
	SendWait time.Duration
	// AttachmentWait bounds how long discord.attachment waits for a fetch
	// still under way (0: 30 s).
	AttachmentWait time.Duration
}

// NewOps returns the discord.* handler.
func NewOps(st *store.Store, review Reviewer, srv *Server) *Ops {
	return &Ops{store: st, review: review, server: srv, SendWait: 10 * time.Second}
}

func refuse(code, format string, a ...any) error {
	return &worker.RequestError{Code: code, Message: fmt.Sprintf(format, a...)}
}

// HandleRequest implements worker.Handler.
func (o *Ops) HandleRequest(ctx context.Context, r worker.Request) (json.RawMessage, error) {
	session := workbench.SessionFrom(ctx)
	if session == "" {
		return nil, refuse("invalid", "%s outside a cell", r.Op)
	}
	if r.Op == "discord.attachment" {
		// Its own decoder: bounded, and it names a message and an attachment only.
		return o.attachment(ctx, session, r.Args)
	}
	var a struct {
		Conversation string            `json:"conversation"`
		Text         string            `json:"text"`
		ReplyTo      string            `json:"reply_to"`
		ItemID       int64             `json:"item_id"`
		MessageID    string            `json:"message_id"`
		Emoji        string            `json:"emoji"`
		Status       string            `json:"status"`
		Note         string            `json:"note"`
		Limit        int               `json:"limit"`
		Before       string            `json:"before"`
		After        string            `json:"after"`
		EffectID     int64             `json:"effect_id"`
		Statuses     []string          `json:"statuses"`
		Files        []json.RawMessage `json:"files"`
	}
	if len(r.Args) > 0 {
		if err := decodeJSON(r.Args, &a); err != nil {
			return nil, refuse("invalid", "%s: %v", r.Op, err)
		}
	}
	switch r.Op {
	case "discord.current":
		c, err := o.current(ctx)
		if err != nil {
			return nil, err
		}
		return json.Marshal(c)
	case "discord.conversations":
		cs, err := o.store.Conversations(ctx)
		if err != nil {
			return nil, err
		}
		if cs == nil {
			cs = []store.Conversation{}
		}
		return json.Marshal(map[string]any{"conversations": cs})
	case "discord.history":
		return o.history(ctx, a.Conversation, a.Limit, a.Before, a.After)
	case "discord.send":
		return o.send(ctx, session, r, a.Conversation, a.Text, a.ReplyTo, a.ItemID, a.Files)
	case "discord.react":
		return o.react(ctx, session, r, a.Conversation, a.MessageID, a.Emoji)
	case "discord.mark":
		return o.mark(ctx, a.ItemID, a.Status, a.Note, a.Conversation)
	case "discord.items":
		return o.items(ctx, session, a.Conversation, a.Statuses, a.Limit)
	case "discord.receipt":
		e, err := o.store.Effect(ctx, a.EffectID)
		if errors.Is(err, store.ErrUnknownEffect) {
			return nil, refuse("not_found", "%v", err)
		}
		if err != nil {
			return nil, err
		}
		return o.receiptJSON(ctx, e)
	}
	return nil, refuse("unsupported", "%s is not a discord operation", r.Op)
}

// items lists the session's attention items, newest first: by default those
// still pending or seen, in every conversation or in one.
func (o *Ops) items(ctx context.Context, session, ref string, statuses []string, limit int) (json.RawMessage, error) {
	if limit == 0 {
		limit = 50
	}
	if limit < 1 || limit > 500 {
		return nil, refuse("invalid", "limit must be 1..500")
	}
	if len(statuses) == 0 {
		statuses = []string{store.ItemPending, store.ItemSeen}
	}
	for _, st := range statuses {
		switch st {
		case store.ItemPending, store.ItemSeen, store.ItemActed, store.ItemIgnored:
		default:
			return nil, refuse("invalid", "status %q is not pending, seen, acted or ignored", clip(st))
		}
	}
	alias := ""
	if ref != "" {
		c, err := o.conversation(ctx, ref)
		if err != nil {
			return nil, err
		}
		alias = c.Alias
	}
	all, err := o.store.AttentionItems(ctx, session, statuses, limit)
	if err != nil {
		return nil, err
	}
	out := []store.AttentionItem{}
	for _, it := range all {
		if alias == "" || it.Conversation == alias {
			out = append(out, it)
		}
	}
	return json.Marshal(map[string]any{"items": out})
}

// frameHandles reads the routing handles of the frame the cell runs under.
func (o *Ops) frameHandles(ctx context.Context) (inputs []int64, conversations []string, err error) {
	call, ok := workbench.CallFrom(ctx)
	if !ok || call.Frame == 0 {
		return nil, nil, nil
	}
	_, raw, err := o.store.FrameRouting(ctx, call.Frame)
	if err != nil {
		return nil, nil, err
	}
	var h struct {
		Inputs        []int64  `json:"inputs"`
		Conversations []string `json:"conversations"`
	}
	if err := json.Unmarshal(raw, &h); err != nil {
		return nil, nil, fmt.Errorf("frame %d: routing handles: %w", call.Frame, err)
	}
	for _, c := range h.Conversations {
		if _, ok := store.ChannelOfKey(c); ok && !contains(conversations, c) {
			conversations = append(conversations, c)
		}
	}
	return h.Inputs, conversations, nil
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// current is the frame's one Discord conversation; with none or several it
// refuses: a default destination must be unambiguous.
func (o *Ops) current(ctx context.Context) (store.Conversation, error) {
	_, convs, err := o.frameHandles(ctx)
	if err != nil {
		return store.Conversation{}, err
	}
	switch len(convs) {
	case 1:
		c, err := o.store.ConversationByRef(ctx, convs[0])
		if errors.Is(err, store.ErrUnknownConversation) {
			return c, refuse("not_found", "%v", err)
		}
		return c, err
	case 0:
		return store.Conversation{}, refuse("no_conversation",
			"this cell's frame has no Discord conversation; name one: discord.conversation(\"d1\") (see discord.conversations())")
	default:
		return store.Conversation{}, refuse("ambiguous",
			"this cell's frame has %d Discord conversations (%s); name the one you mean", len(convs), strings.Join(convs, ", "))
	}
}

func (o *Ops) conversation(ctx context.Context, ref string) (store.Conversation, error) {
	if ref == "" {
		return o.current(ctx)
	}
	c, err := o.store.ConversationByRef(ctx, ref)
	if errors.Is(err, store.ErrUnknownConversation) {
		return c, refuse("not_found", "no conversation %q; see discord.conversations()", ref)
	}
	return c, err
}

func (o *Ops) history(ctx context.Context, ref string, limit int, before, after string) (json.RawMessage, error) {
	c, err := o.conversation(ctx, ref)
	if err != nil {
		return nil, err
	}
	if limit == 0 {
		limit = 20
	}
	if limit < 1 || limit > ingressapi.MaxReadLimit {
		return nil, refuse("invalid", "limit must be 1..%d", ingressapi.MaxReadLimit)
	}
	if (before != "" && !isSnowflake(before)) || (after != "" && !isSnowflake(after)) {
		return nil, refuse("invalid", "before and after are Discord message ids")
	}
	rctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	msgs, err := o.server.Read(rctx, ingressapi.Read{ChannelID: c.ChannelID, Limit: limit, Before: before, After: after})
	if err != nil {
		return nil, refuse("unavailable", "%v", err)
	}
	if msgs == nil {
		msgs = []ingressapi.HistoryMessage{}
	}
	return json.Marshal(map[string]any{"conversation": c.Alias, "messages": msgs})
}

// Receipt is what a cell is told about an effect. Delivered is true only
// for a confirmed effect.
type Receipt struct {
	EffectID       int64  `json:"effect_id"`
	Kind           string `json:"kind"`
	State          string `json:"state"`
	Delivered      bool   `json:"delivered"`
	Conversation   string `json:"conversation"`
	MessageID      string `json:"message_id,omitempty"`
	ReplyReference bool   `json:"reply_reference,omitempty"`
	ItemID         int64  `json:"item_id,omitempty"`
	ErrorCode      string `json:"error_code,omitempty"`
	Error          string `json:"error,omitempty"`
	Repeat         bool   `json:"repeat,omitempty"`
	Note           string `json:"note,omitempty"`
	// Files a send carries, in order; AttachmentID is Discord's once it
	// confirmed the message ("" before, or when evidence settled it).
	Files []ReceiptFile `json:"files,omitempty"`
}

// ReceiptFile is a file of a send as its receipt names it.
type ReceiptFile struct {
	Filename     string `json:"filename"`
	Size         int64  `json:"size"`
	AttachmentID string `json:"attachment_id,omitempty"`
}

// receipt is what the cell is told of e, a send's files included.
func (o *Ops) receipt(ctx context.Context, e store.Effect) (Receipt, error) {
	r := Receipt{EffectID: e.ID, Kind: e.Kind, State: e.State, Delivered: e.State == store.EffectConfirmed, Conversation: e.Conversation,
		MessageID: e.MessageID, ReplyReference: e.ReplyReference, ItemID: e.ItemID, ErrorCode: e.ErrorCode, Error: e.Error, Repeat: e.Repeat}
	if e.Kind != store.EffectSend {
		return r, nil
	}
	fs, err := o.store.EffectFiles(context.WithoutCancel(ctx), e.ID)
	if err != nil {
		return r, err
	}
	for _, f := range fs {
		r.Files = append(r.Files, ReceiptFile{Filename: f.Filename, Size: f.Size, AttachmentID: f.AttachmentID})
	}
	return r, nil
}

// receiptJSON is the receipt of e, encoded.
func (o *Ops) receiptJSON(ctx context.Context, e store.Effect) (json.RawMessage, error) {
	r, err := o.receipt(ctx, e)
	if err != nil {
		return nil, err
	}
	return json.Marshal(r)
}

// Preparer is delivery.prepare (package hooks): the parts a send is made of.
type Preparer interface {
	PrepareDeliveryAt(ctx context.Context, session string, pin *store.Pin, in hooks.DeliveryInput) []string
}

func (o *Ops) send(ctx context.Context, session string, r worker.Request, ref, text, replyTo string, itemID int64, paths []json.RawMessage) (json.RawMessage, error) {
	if text == "" || len(text) > utf8.UTFMax*MaxSendChars*hooks.MaxParts || !utf8.ValidString(text) ||
		utf8.RuneCountInString(text) > MaxSendChars*hooks.MaxParts {
		return nil, refuse("invalid", "discord send: text must be 1 to %d characters of UTF-8 (delivery.prepare splits it into messages of %d)",
			MaxSendChars*hooks.MaxParts, MaxSendChars)
	}
	if replyTo != "" && !isSnowflake(replyTo) {
		return nil, refuse("invalid", "reply_to is a Discord message id")
	}
	if len(paths) > ingressapi.MaxSendFiles {
		return nil, refuse("invalid", "discord send: %d files; Discord takes at most %d a message", len(paths), ingressapi.MaxSendFiles)
	}
	exec, pin, err := o.scope(ctx, r)
	if err != nil {
		return nil, err
	}
	c, err := o.conversation(ctx, ref)
	if err != nil {
		return nil, err
	}
	// The files are copied from the workspace now (what is reviewed is
	// what goes out), before anything is recorded.
	files, err := o.sendFiles(ctx, session, paths)
	if err != nil {
		return nil, err
	}
	if itemID == 0 {
		// Only the frame's own items may be inferred, never a later batch's.
		inputs, _, err := o.frameHandles(ctx)
		if err != nil {
			return nil, err
		}
		if itemID, err = o.store.FrameItem(ctx, inputs, c.ID); err != nil {
			return nil, err
		}
	} else if it, err := o.store.AttentionItem(ctx, itemID); err != nil || it.Conversation != c.Alias {
		return nil, refuse("invalid", "item %d is not an attention item of %s", itemID, c.Alias)
	}
	frame := int64(0)
	if call, ok := workbench.CallFrom(ctx); ok {
		frame = call.Frame
	}
	// delivery.prepare shapes the text into parts (Discord takes 2,000
	// characters a message); each part is reviewed, sent and receipted on its own,
	// to the same destination.
	parts := []string{text}
	if p, ok := o.review.(Preparer); ok {
		parts = p.PrepareDeliveryAt(ctx, session, &pin, hooks.DeliveryInput{Channel: "discord", Destination: c.Alias, Session: session,
			Limit: MaxSendChars, Parts: parts})
	}
	for _, part := range parts {
		if n := utf8.RuneCountInString(part); n > MaxSendChars {
			return nil, refuse("invalid", "discord send: a message is 1 to %d characters (delivery.prepare did not split %d)", MaxSendChars, n)
		}
	}
	var first json.RawMessage
	var receipts []json.RawMessage
	for i, part := range parts {
		// Reviewed outside any transaction, under the cell's own behavior; a
		// review that does not decide holds the send.
		in := hooks.ReviewInput{Channel: "discord", Text: part, Destination: c.Alias, Session: session}
		if i == 0 {
			in.Files = reviewFiles(files)
		}
		dec := o.review.ReviewAt(ctx, session, &pin, in)
		key := fmt.Sprintf("x%d/r%d", exec, r.ID)
		n := store.NewEffect{Session: session, Kind: store.EffectSend, ConversationID: c.ID, IdempotencyKey: key,
			Nonce: newNonce(), Text: part, Target: replyTo, ItemID: itemID, Execution: exec, Frame: frame, Epoch: pin.Epoch, Files: files}
		if i > 0 {
			// Only the first part replies, answers an item or carries files.
			n.IdempotencyKey, n.Target, n.ItemID, n.Files = fmt.Sprintf("%s/p%d", key, i), "", 0, nil
		}
		if !dec.Allow {
			n.Held, n.Reason = true, "held by delivery.review: "+dec.Reason
		}
		rc, err := o.enqueueAndWait(ctx, session, n)
		if err != nil {
			return nil, err
		}
		if i == 0 {
			first = rc
		}
		receipts = append(receipts, rc)
	}
	if len(parts) == 1 {
		return first, nil
	}
	return withParts(first, receipts)
}

// withParts is the first part's receipt with every part's under "parts".
func withParts(first json.RawMessage, parts []json.RawMessage) (json.RawMessage, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(first, &m); err != nil {
		return nil, err
	}
	m["parts"], _ = json.Marshal(parts)
	return json.Marshal(m)
}

func (o *Ops) react(ctx context.Context, session string, r worker.Request, ref, messageID, emoji string) (json.RawMessage, error) {
	if !isSnowflake(messageID) {
		return nil, refuse("invalid", "react: message_id is a Discord message id")
	}
	if emoji == "" || utf8.RuneCountInString(emoji) > MaxEmojiLen || !utf8.ValidString(emoji) || strings.ContainsAny(emoji, "/?#") {
		return nil, refuse("invalid", "react: emoji is a Unicode emoji or name:id of a custom one")
	}
	exec, pin, err := o.scope(ctx, r)
	if err != nil {
		return nil, err
	}
	c, err := o.conversation(ctx, ref)
	if err != nil {
		return nil, err
	}
	// A reaction is an effect like a send: reviewed outside any
	// transaction, under the cell's own behavior, held when not allowed.
	n := store.NewEffect{Session: session, Kind: store.EffectReact, ConversationID: c.ID,
		IdempotencyKey: fmt.Sprintf("x%d/r%d", exec, r.ID), Nonce: newNonce(), Emoji: emoji, Target: messageID, Execution: exec, Epoch: pin.Epoch}
	dec := o.review.ReviewAt(ctx, session, &pin, hooks.ReviewInput{Channel: "discord", Kind: "react", Text: emoji, Target: messageID,
		Destination: c.Alias, Session: session})
	if !dec.Allow {
		n.Held, n.Reason = true, "held by delivery.review: "+dec.Reason
	}
	return o.enqueueAndWait(ctx, session, n)
}

// scope is the journaled cell a request comes from.
func (o *Ops) scope(ctx context.Context, r worker.Request) (int64, store.Pin, error) {
	pin, pinned := workbench.PinFrom(ctx)
	exec, err := strconv.ParseInt(strings.TrimPrefix(r.Execution, "x"), 10, 64)
	if !pinned || err != nil {
		return 0, pin, refuse("invalid", "%s outside a journaled cell", r.Op)
	}
	return exec, pin, nil
}

// enqueueAndWait records the effect, hands it to the transport and waits a
// bounded time for its receipt. An effect still pending or attempting then
// is answered as such: enqueueing is not delivery.
func (o *Ops) enqueueAndWait(ctx context.Context, session string, n store.NewEffect) (json.RawMessage, error) {
	wake, cancel := o.store.Watch(session) // before the write: no settle is missed
	defer cancel()
	var e store.Effect
	if err := o.store.Write(context.WithoutCancel(ctx), func(tx *store.Tx) (err error) {
		e, err = tx.EnqueueEffect(n)
		return err
	}); err != nil {
		if errors.Is(err, store.ErrItemElsewhere) || errors.Is(err, store.ErrUnknownItem) {
			return nil, refuse("invalid", "%v", err)
		}
		return nil, err
	}
	if e.State == store.EffectHeld {
		o.server.Kick() // the operator's notice, if one is configured
	}
	if e.State == store.EffectPending {
		o.server.Kick()
		if !o.server.Connected() {
			// It stays in the outbox until klbr-discord claims it; waiting here helps nobody.
			r, err := o.receipt(ctx, e)
			if err != nil {
				return nil, err
			}
			r.Note = "klbr-discord is not connected: the effect waits in the outbox; see it with receipt.refresh()"
			return json.Marshal(r)
		}
	}
	wait := o.SendWait
	if wait <= 0 {
		wait = 10 * time.Second
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for e.State == store.EffectPending || e.State == store.EffectAttempting {
		select {
		case <-wake:
		case <-timer.C:
			return o.receiptJSON(ctx, e)
		case <-ctx.Done():
			return o.receiptJSON(ctx, e)
		}
		got, err := o.store.Effect(context.WithoutCancel(ctx), e.ID)
		if err != nil {
			return nil, err
		}
		got.Repeat = e.Repeat
		e = got
	}
	return o.receiptJSON(ctx, e)
}

func (o *Ops) mark(ctx context.Context, itemID int64, status, note, ref string) (json.RawMessage, error) {
	if len(note) > MaxNoteBytes || !utf8.ValidString(note) {
		return nil, refuse("invalid", "mark: note is at most %d bytes of UTF-8", MaxNoteBytes)
	}
	var conv int64
	if ref != "" {
		c, err := o.conversation(ctx, ref)
		if err != nil {
			return nil, err
		}
		conv = c.ID
	}
	var before store.AttentionItem
	err := o.store.Write(ctx, func(tx *store.Tx) (err error) {
		before, err = tx.Mark(itemID, status, store.OriginModel, note, conv)
		return err
	})
	switch {
	case errors.Is(err, store.ErrUnknownItem):
		return nil, refuse("not_found", "%v", err)
	case errors.Is(err, store.ErrItemElsewhere), errors.Is(err, store.ErrAttentionMove):
		return nil, refuse("invalid", "%v", err)
	case err != nil:
		return nil, err
	}
	it, err := o.store.AttentionItem(ctx, itemID)
	if err != nil {
		return nil, err
	}
	return json.Marshal(map[string]any{"item": it, "previous_status": before.Status})
}

// newNonce is a Discord nonce: 25 characters at most, unique per effect.
func newNonce() string {
	var b [12]byte
	rand.Read(b[:])
	return "k" + hex.EncodeToString(b[:])
}
