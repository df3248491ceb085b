// Package observe delivers committed events to the durable observers a
// session's active behavior release binds ([[hooks.observers]] of its
// settings.toml), and carries out the commands they propose.
//
// Each committed event of a bound kind becomes a delivery row per bound
// handler (a cursor per binding; a handler first bound starts at the newest
// event). Deliveries of one handler are made in order, one at a time: the
// handler is called with the event and its state, and its answer, the new
// state and the proposed commands commit in one transaction (a retried
// delivery never mints commands twice). A failed delivery is retried with
// backoff, then dead-lettered with a notice. Commands go through the same
// review, outbox and receipts as a cell's, carrying the causing event and
// the handler; the loop limits (causal depth, a per-window quota) refuse
// the rest with a notice.
package observe

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/klbr-dev/klbr/internal/hooks"
	"github.com/klbr-dev/klbr/internal/ingress/ingressapi"
	"github.com/klbr-dev/klbr/internal/store"
)

// Config is what a Runner is made of.
type Config struct {
	Store *store.Store
	Hooks *hooks.Dispatcher
	// Kick tells the Discord transport an effect waits (nil: nothing).
	Kick   func()
	Limits store.LoopLimits
	// MaxAttempts of a delivery before it is dead-lettered; Backoff is the
	// first retry's delay, doubling up to MaxBackoff.
	MaxAttempts         int
	Backoff, MaxBackoff time.Duration
	Log                 *slog.Logger
	Clock               func() time.Time
	// Observe, if set, is told of each delivery's latency from its event's
	// commit to the handler's answer, and its outcome (metrics).
	Observe func(handler, outcome string, latency time.Duration)
	// Delegated, if set, checks a speech command (local.send, discord.*)
	// of session as a cell's is checked (agents.Delegated): an error
	// refuses it; child, when not nil, names the child agent it is
	// carried out for, in its receipt.
	Delegated func(ctx context.Context, session, op string) (child any, err error)
}

// Default loop limits and retries.
const (
	DefaultMaxDepth    = 3
	DefaultQuota       = 30
	DefaultWindow      = time.Minute
	DefaultMaxAttempts = 8
)

// Runner runs every session's observers.
type Runner struct {
	cfg    Config
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	sessions map[string]bool
	// bound is the release each session's bindings were last recorded
	// for, and projected the newest event projected: a pass with nothing new
	// writes nothing.
	bound     map[string]string
	projected map[string]int64
	paused    map[string]map[string]bool // by session, handler
}

// New returns a Runner; Start runs a session's observers.
func New(cfg Config) *Runner {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.Limits.MaxDepth == 0 {
		cfg.Limits.MaxDepth = DefaultMaxDepth
	}
	if cfg.Limits.Quota == 0 {
		cfg.Limits.Quota = DefaultQuota
	}
	if cfg.Limits.Window == 0 {
		cfg.Limits.Window = DefaultWindow
	}
	if cfg.MaxAttempts == 0 {
		cfg.MaxAttempts = DefaultMaxAttempts
	}
	if cfg.Backoff == 0 {
		cfg.Backoff = time.Second
	}
	if cfg.MaxBackoff == 0 {
		cfg.MaxBackoff = 5 * time.Minute
	}
	if cfg.Observe == nil {
		cfg.Observe = func(string, string, time.Duration) {}
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Runner{cfg: cfg, ctx: ctx, cancel: cancel, sessions: map[string]bool{}, bound: map[string]string{}, projected: map[string]int64{},
		paused: map[string]map[string]bool{}}
}

// Limits are the loop limits in force (status shows them).
func (r *Runner) Limits() store.LoopLimits { return r.cfg.Limits }

// Start runs session's observers until Close.
func (r *Runner) Start(session string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.sessions[session] || r.ctx.Err() != nil {
		return
	}
	r.sessions[session] = true
	r.wg.Go(func() { r.run(session) })
}

// Close stops every loop and waits for them.
func (r *Runner) Close() {
	r.cancel()
	r.wg.Wait()
}

func (r *Runner) run(session string) {
	wake, cancel := r.cfg.Store.Watch(session)
	defer cancel()
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-r.ctx.Done():
			return
		case <-wake:
		case <-timer.C:
		}
		next, err := r.Pass(r.ctx, session)
		if r.ctx.Err() != nil {
			return
		}
		if err != nil {
			r.cfg.Log.Error("observers", "session", session, "error", err)
			next = r.cfg.Clock().Add(time.Second)
		}
		timer.Stop()
		wait := time.Second // a fallback look, should a wake be missed
		if !next.IsZero() {
			wait = min(wait, max(time.Until(next), 0))
		}
		timer.Reset(wait)
	}
}

// Pass binds, projects, delivers what is due and carries out open
// commands, once; it returns when a retry falls due (zero: none).
func (r *Runner) Pass(ctx context.Context, session string) (time.Time, error) {
	st := r.cfg.Store
	s, err := st.Session(ctx, session)
	if err != nil || s.PolicyRevision == "" {
		return time.Time{}, err
	}
	b := r.cfg.Hooks.Binding(s.PolicyRevision)
	var next time.Time
	r.mu.Lock()
	rebind := r.bound[session] != s.PolicyRevision
	r.mu.Unlock()
	last, err := st.LastObserverEvent(ctx, session)
	if err != nil {
		return next, err
	}
	r.mu.Lock()
	project := rebind || last > r.projected[session]
	r.mu.Unlock()
	if rebind {
		keep := []string{}
		for _, ob := range b.Observers {
			keep = append(keep, ob.Handler)
		}
		if err := st.Write(ctx, func(tx *store.Tx) error { return tx.UnbindObservers(session, s.PolicyRevision, keep) }); err != nil {
			return next, err
		}
	}
	paused := map[string]bool{}
	for _, ob := range b.Observers {
		if !rebind {
			continue
		}
		var bound store.ObserverBinding
		if err := st.Write(ctx, func(tx *store.Tx) (err error) {
			bound, err = tx.BindObserver(session, ob.Handler, s.PolicyRevision, ob.Events, ob.StateVersion, ob.MigratesFrom)
			return err
		}); err != nil {
			return next, err
		}
		paused[ob.Handler] = bound.Paused != ""
	}
	if rebind {
		r.mu.Lock()
		r.bound[session], r.paused[session] = s.PolicyRevision, paused
		r.mu.Unlock()
	}
	for _, ob := range b.Observers {
		r.mu.Lock()
		isPaused := r.paused[session][ob.Handler]
		r.mu.Unlock()
		if isPaused {
			continue
		}
		for project {
			var n int
			if err := st.Write(ctx, func(tx *store.Tx) (err error) {
				n, err = tx.ProjectObserver(session, ob.Handler, 500)
				return err
			}); err != nil {
				return next, err
			}
			if n < 500 {
				break
			}
		}
		due, err := r.deliver(ctx, session, ob)
		if err != nil {
			return next, err
		}
		next = earliest(next, due)
	}
	if project {
		r.mu.Lock()
		r.projected[session] = last
		r.mu.Unlock()
	}
	return next, r.commands(ctx, session)
}

// deliver makes handler's due deliveries in order until one is not due.
func (r *Runner) deliver(ctx context.Context, session string, ob hooks.ObserverBinding) (time.Time, error) {
	st := r.cfg.Store
	for ctx.Err() == nil {
		d, err := st.NextObserverDelivery(ctx, session, ob.Handler)
		if err != nil || d == nil {
			return time.Time{}, err
		}
		if now := r.cfg.Clock(); now.Before(d.NextAt) {
			return d.NextAt, nil
		}
		o := r.cfg.Hooks.Observe(ctx, session, ob.Handler, hooks.ObserveInput{Event: d.Event, State: d.State, StateVersion: d.StateVersion})
		if ctx.Err() != nil {
			return time.Time{}, nil // stopping: the delivery stays pending
		}
		outcome := "ok"
		if o.Problem != "" {
			outcome = "failed"
			backoff := r.cfg.Backoff << min(d.Attempts, 20)
			if backoff > r.cfg.MaxBackoff || backoff <= 0 {
				backoff = r.cfg.MaxBackoff
			}
			err = st.Write(ctx, func(tx *store.Tx) error {
				dead, err := tx.FailObserverDelivery(d.ID, o.Problem, tx.Now().Add(backoff), r.cfg.MaxAttempts)
				if dead {
					outcome = "dead"
				}
				return err
			})
			r.cfg.Observe(ob.Handler, outcome, time.Since(d.Event.At))
			if err != nil && !store.IsDeliverySettled(err) {
				return time.Time{}, err
			}
			continue
		}
		err = st.Write(ctx, func(tx *store.Tx) error {
			_, _, err := tx.AckObserverDelivery(store.Ack{Delivery: d.ID, Release: o.Release, State: o.Answer.State,
				Version: ob.StateVersion, Commands: o.Answer.Commands, Limits: r.cfg.Limits})
			return err
		})
		r.cfg.Observe(ob.Handler, outcome, time.Since(d.Event.At))
		if err != nil && !store.IsDeliverySettled(err) {
			return time.Time{}, err
		}
		if err := r.commands(ctx, session); err != nil {
			return time.Time{}, err
		}
	}
	return time.Time{}, nil
}

// commands carries out session's open observer commands, oldest first.
func (r *Runner) commands(ctx context.Context, session string) error {
	for ctx.Err() == nil {
		cmds, err := r.cfg.Store.OpenObserverCommands(ctx, session, 32)
		if err != nil || len(cmds) == 0 {
			return err
		}
		for _, c := range cmds {
			if err := r.carryOut(ctx, c); err != nil && !store.IsDeliverySettled(err) {
				return err
			}
		}
	}
	return nil
}

// refuse closes a command that cannot be carried out, saying why.
func (r *Runner) refuse(ctx context.Context, c store.ObserverCommand, why string) error {
	return r.cfg.Store.Write(context.WithoutCancel(ctx), func(tx *store.Tx) error {
		return tx.FinishObserverCommand(c.ID, "refused", map[string]string{"reason": why}, 0)
	})
}

// MaxLocalText bounds an observer's local send.
const MaxLocalText = 64 << 10

// carryOut carries out one command through the same review, outbox and
// receipts as a cell's.
func (r *Runner) carryOut(ctx context.Context, c store.ObserverCommand) error {
	st := r.cfg.Store
	var a struct {
		Text         string `json:"text"`
		Conversation string `json:"conversation"`
		MessageID    string `json:"message_id"`
		Emoji        string `json:"emoji"`
		ItemID       int64  `json:"item_id"`
		Status       string `json:"status"`
		Note         string `json:"note"`
	}
	if err := json.Unmarshal(c.Args, &a); err != nil {
		return r.refuse(ctx, c, "args: "+err.Error())
	}
	var child any
	if r.cfg.Delegated != nil {
		var err error
		if child, err = r.cfg.Delegated(ctx, c.Session, c.Op); err != nil {
			return r.refuse(ctx, c, err.Error())
		}
	}
	wctx := context.WithoutCancel(ctx)
	switch c.Op {
	case "local.send":
		if a.Text == "" || len(a.Text) > MaxLocalText || !utf8.ValidString(a.Text) {
			return r.refuse(ctx, c, fmt.Sprintf("local.send: text must be 1 to %d bytes of UTF-8", MaxLocalText))
		}
		dec := r.cfg.Hooks.Review(ctx, c.Session, hooks.ReviewInput{Channel: "local", Text: a.Text, Session: c.Session})
		status := "held"
		if dec.Allow {
			status = "confirmed"
		}
		return st.Write(wctx, func(tx *store.Tx) error {
			_, err := tx.RecordObserverSend(store.ObserverSend{Command: c.ID, Session: c.Session, Handler: c.Handler, Text: a.Text,
				Status: status, Reason: dec.Reason, Epoch: dec.Epoch, Release: dec.Release, Fallback: dec.Fallback, Child: child})
			return err
		})
	case "runtime.wakeup":
		return st.Write(wctx, func(tx *store.Tx) error {
			woke, err := tx.WakeNow(c.Session)
			if err != nil {
				return err
			}
			return tx.FinishObserverCommand(c.ID, "done", map[string]bool{"woke": woke}, 0)
		})
	case "discord.send", "discord.react":
		conv, err := st.ConversationByRef(ctx, a.Conversation)
		if errors.Is(err, store.ErrUnknownConversation) {
			return r.refuse(ctx, c, fmt.Sprintf("%s: no conversation %q", c.Op, a.Conversation))
		}
		if err != nil {
			return err
		}
		n := store.NewEffect{Session: c.Session, ConversationID: conv.ID, IdempotencyKey: fmt.Sprintf("o%d", c.ID), Nonce: nonce()}
		if c.Op == "discord.send" {
			if a.Text == "" || !utf8.ValidString(a.Text) || utf8.RuneCountInString(a.Text) > ingressapi.MaxSendChars {
				return r.refuse(ctx, c, fmt.Sprintf("discord.send: text must be 1 to %d characters of UTF-8 (Discord's limit)", ingressapi.MaxSendChars))
			}
			n.Kind, n.Text = store.EffectSend, a.Text
			dec := r.cfg.Hooks.Review(ctx, c.Session, hooks.ReviewInput{Channel: "discord", Text: a.Text, Destination: conv.Alias, Session: c.Session})
			n.Epoch = dec.Epoch
			if !dec.Allow {
				n.Held, n.Reason = true, "held by delivery.review: "+dec.Reason
			}
		} else {
			if a.Emoji == "" || a.MessageID == "" || len(a.Emoji) > 256 || len(a.MessageID) > 32 {
				return r.refuse(ctx, c, "discord.react: needs message_id and emoji")
			}
			n.Kind, n.Emoji, n.Target = store.EffectReact, a.Emoji, a.MessageID
			dec := r.cfg.Hooks.Review(ctx, c.Session, hooks.ReviewInput{Channel: "discord", Kind: "react", Text: a.Emoji, Target: a.MessageID,
				Destination: conv.Alias, Session: c.Session})
			n.Epoch = dec.Epoch
			if !dec.Allow {
				n.Held, n.Reason = true, "held by delivery.review: "+dec.Reason
			}
		}
		err = st.Write(wctx, func(tx *store.Tx) error {
			e, err := tx.EnqueueEffect(n)
			if err != nil {
				return err
			}
			res := map[string]any{"effect_id": e.ID, "state": e.State}
			if child != nil {
				res["child"] = child
			}
			return tx.FinishObserverCommand(c.ID, "done", res, e.ID)
		})
		if err == nil && r.cfg.Kick != nil {
			r.cfg.Kick()
		}
		return err
	case "discord.mark":
		switch a.Status {
		case store.ItemPending, store.ItemSeen, store.ItemActed, store.ItemIgnored:
		default:
			return r.refuse(ctx, c, fmt.Sprintf("discord.mark: status %q is not pending, seen, acted or ignored", a.Status))
		}
		if len(a.Note) > 1024 || !utf8.ValidString(a.Note) {
			return r.refuse(ctx, c, "discord.mark: note is at most 1024 bytes of UTF-8")
		}
		it, err := st.AttentionItem(ctx, a.ItemID)
		if err != nil || it.Session != c.Session {
			return r.refuse(ctx, c, fmt.Sprintf("discord.mark: item %d is not an attention item of %s", a.ItemID, c.Session))
		}
		return st.Write(wctx, func(tx *store.Tx) error {
			before, err := tx.Mark(a.ItemID, a.Status, store.OriginModel, "observer "+c.Handler+": "+a.Note, 0)
			if errors.Is(err, store.ErrAttentionMove) || errors.Is(err, store.ErrUnknownItem) {
				return tx.FinishObserverCommand(c.ID, "refused", map[string]string{"reason": err.Error()}, 0)
			}
			if err != nil {
				return err
			}
			res := map[string]any{"item_id": a.ItemID, "from": before.Status, "to": a.Status}
			if child != nil {
				res["child"] = child
			}
			return tx.FinishObserverCommand(c.ID, "done", res, 0)
		})
	}
	return r.refuse(ctx, c, "unknown op "+c.Op)
}

func nonce() string {
	var b [12]byte
	rand.Read(b[:])
	return "o" + hex.EncodeToString(b[:])
}

func earliest(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}
