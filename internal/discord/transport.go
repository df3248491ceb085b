package discord

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bwmarrin/discordgo"

	"github.com/klbr-dev/klbr/internal/ingress/ingressapi"
)

// Config is what the transport runs with.
type Config struct {
	Token         string // never logged
	APIBase       string
	IngressSocket string
	Channels      []string
	Directed      bool
	IncludeBots   bool
	Instance      string
	Log           *slog.Logger
	// QueueSize bounds the messages waiting for admission (0: 65536). A full
	// queue stops reading the gateway; a resume replays what was missed.
	QueueSize int
	// Fetch bounds attachment fetching.
	Fetch FetchLimits
	// Probe bounds the deafness probe.
	Probe ProbeLimits
	// Flood bounds the admission of live messages per author and channel.
	Flood FloodLimits
	// Operator is discord.operator_user_id: never rate-limited.
	Operator string
	// InvalidRequestLimit is Discord's invalid-request limit per 10 minutes
	// (0: 10,000); non-essential calls stop at half of it, all at 90%.
	InvalidRequestLimit int
	// Filters, if set, carries new channel filters while the transport runs
	// (klbr-discord's SIGHUP): each replaces Channels, Directed and
	// IncludeBots from the next gateway event on.
	Filters <-chan Filter
}

// Run runs the transport until ctx ends (nil) or the gateway closes for good
// (a *FatalError naming what to fix).
func Run(ctx context.Context, cfg Config) error {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.QueueSize <= 0 {
		cfg.QueueSize = 65536
	}
	if cfg.Instance == "" {
		cfg.Instance = strconv.FormatInt(time.Now().UnixNano(), 36)
	}
	budget := newInvalidBudget(cfg.InvalidRequestLimit)
	rest, err := newSession(cfg.Token, cfg.APIBase, budget)
	if err != nil {
		return err
	}
	core := ingressapi.NewClient(cfg.IngressSocket)
	defer core.Close()
	t := &transport{cfg: cfg, rest: rest, core: core, link: newCoreLink(cfg.Log), log: cfg.Log, queue: make(chan ingressapi.Message, cfg.QueueSize),
		urgent: make(chan ingressapi.Message, urgentQueue), flood: newFlood(cfg.Flood, cfg.Operator), order: newOrder(), echoes: newEchoes(4096), unsettled: newUnsettled(1024), ready: make(chan struct{}), helloed: make(chan struct{}),
		budget: budget, watch: newWatch(), joins: make(chan ThreadCreate, threadJoinQueue), rediscover: newRediscovery(),
		filter: Filter{Channels: cfg.Channels, Directed: cfg.Directed, IncludeBots: cfg.IncludeBots, Threads: map[string]string{}}}
	t.channels.Store(&Filter{Channels: cfg.Channels, Directed: cfg.Directed, IncludeBots: cfg.IncludeBots})
	t.fetch = newFetcher(cfg.Fetch, core, rest, cfg.Log.With("component", "fetcher"), t.helloed)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	t.ctx = ctx
	t.stop = cancel
	wg := &t.wg
	wg.Go(func() { t.admitLoop(ctx) })
	wg.Go(func() { t.performLoop(ctx) })
	wg.Go(func() { t.joinLoop(ctx) })
	wg.Go(func() { t.floodLoop(ctx) })
	t.fetch.run(ctx, wg)
	gw := NewGateway(rest, cfg.Token, cfg.Log.With("component", "gateway"), GatewayEvents{
		Ready: func(id string, guilds []string) {
			t.filter.BotID = id
			t.botID.Store(&id)
			t.guilds.Store(&guilds)
			t.readyOnce.Do(func() { close(t.ready) })
			cfg.Log.Info("gateway ready", "bot_id", id)
			if t.sessions.Load() > 0 { // a new session: the one before was lost
				var mark string
				if m := t.lostMark.Load(); m != nil {
					mark = *m
				}
				t.rediscover.request(mark, "while the gateway session was lost")
			}
		},
		Message:     t.onMessage,
		Thread:      t.onThread,
		Interaction: t.onInteraction,
		Gap: func(reason string) {
			t.gaps.Add(1)
			cfg.Log.Warn("gateway: events may be missing", "reason", reason)
			t.enqueue(ctx, ingressapi.Message{MessageID: "g" + strconv.FormatInt(time.Now().UnixNano(), 10), Mode: ingressapi.ModeGap,
				Content: "[klbr-discord] " + reason, OccurredAt: time.Now()})
		},
		State: func(connected, resumed bool) {
			if t.connected.Swap(connected) && !connected {
				mark := t.watch.newestAll() // where it last heard Discord
				t.lostMark.Store(&mark)
			}
			switch {
			case resumed:
				t.resumes.Add(1)
				cfg.Log.Info("gateway resumed")
			case connected:
				t.sessions.Add(1)
			}
		},
	})
	wg.Go(func() { t.probeLoop(ctx, gw) })
	err = gw.Run(ctx)
	cancel()
	wg.Wait()
	t.floodFlush()
	if f := t.fenced.Load(); f != nil {
		return *f
	}
	return err
}

// ErrFenced is returned when klbr-core refuses this transport because
// another klbr-discord delivers for the same data directory.
var ErrFenced = errors.New("another klbr-discord is the sender")

type transport struct {
	stop   context.CancelFunc
	fenced atomic.Pointer[error] // set when klbr-core refused this transport's hello
	cfg    Config
	rest   *discordgo.Session
	core   *ingressapi.Client
	link   *coreLink // whether klbr-core answers, logged at each change
	log    *slog.Logger
	queue  chan ingressapi.Message
	urgent chan ingressapi.Message // DMs: admitted before the rest
	flood  *flood
	order  *order // channels whose older messages may not be admitted yet
	fetch  *fetcher
	// helloed is closed at the first hello: admission and the fetcher
	// start then.
	helloed   chan struct{}
	helloOnce sync.Once
	filter    Filter     // used only by the gateway's goroutine, but for Threads (parentsMu)
	parentsMu sync.Mutex // guards filter.Threads (thread discovery adds to it) and joinedThreads
	// joinedThreads are the threads this transport joined (at most maxThreads).
	joinedThreads map[string]bool
	guilds        atomic.Pointer[[]string] // READY's guilds
	// channels is the channel filter in force (Channels, Directed,
	// IncludeBots), for the goroutines that read history (catchUp) and
	// discover threads.
	channels atomic.Pointer[Filter]
	ctx      context.Context // Run's

	echoes       *echoes                // our own messages seen on the gateway, by nonce
	unsettled    *unsettled             // sends reported unknown, by nonce: a late echo settles them
	botID        atomic.Pointer[string] // from READY; read by the performer
	ready        chan struct{}          // closed at the first READY: the bot id is known
	readyOnce    sync.Once
	discoverOnce sync.Once      // threads that existed before start are found once
	noContent    sync.Once      // the warning that messages arrive without text
	wg           sync.WaitGroup // Run's goroutines

	budget *invalidBudget    // invalid REST answers (401/403/429) in the last 10 minutes
	watch  *watch            // the newest message seen per active channel: the deafness probe's
	joins  chan ThreadCreate // new threads to join
	// rediscover asks joinLoop to list active threads again after the
	// gateway was not heard; lostMark is the newest message seen when the
	// last connection ended.
	rediscover *rediscovery
	lostMark   atomic.Pointer[string]
	dms        dmChannels // DM channels opened (the operator's, for held sends)

	// Gateway state, reported to the core with each claim (its /metrics).
	connected                                  atomic.Bool
	sessions, resumes, gaps, admitted, dropped atomic.Uint64
	gapRecoveries, threadJoins                 atomic.Uint64
	rateLimited, floodBursts                   atomic.Uint64
}

// urgentQueue bounds the DMs waiting for admission; past it a DM waits in
// the main queue.
const urgentQueue = 4096

func (t *transport) bot() string {
	if id := t.botID.Load(); id != nil {
		return *id
	}
	return ""
}

func (t *transport) stats() *ingressapi.GatewayStats {
	return &ingressapi.GatewayStats{Connected: t.connected.Load(), Sessions: t.sessions.Load(), Resumes: t.resumes.Load(),
		Gaps: t.gaps.Load(), Admitted: t.admitted.Load(), Dropped: t.dropped.Load(),
		GapRecoveries: t.gapRecoveries.Load(), ThreadJoins: t.threadJoins.Load(), InvalidRequests: uint64(t.budget.count()),
		RateLimited: t.rateLimited.Load(), RateLimitBursts: t.floodBursts.Load()}
}

// takeFilter puts in force a filter Config.Filters carries, if one waits.
// It runs on the gateway's goroutine, the filter's only user.
func (t *transport) takeFilter() {
	select {
	case f := <-t.cfg.Filters:
		t.filter.Channels, t.filter.Directed, t.filter.IncludeBots = f.Channels, f.Directed, f.IncludeBots
		t.channels.Store(&Filter{Channels: f.Channels, Directed: f.Directed, IncludeBots: f.IncludeBots})
		t.log.Info("channel filter in force", "channels", len(f.Channels), "directed", f.Directed, "include_bots", f.IncludeBots)
	default:
	}
}

// onMessage normalizes a MESSAGE_CREATE and queues it for admission.
func (t *transport) onMessage(data json.RawMessage) {
	t.takeFilter()
	if nonce, id, ok := ownEcho(data, t.filter.BotID); ok {
		t.echoes.add(nonce, id)
		if effect, ok := t.unsettled.take(nonce); ok {
			t.settleLate(effect, id)
		}
	}
	if id, ch, ok := eventChannel(data); ok {
		t.watch.seen(ch, id)
	}
	t.parentsMu.Lock()
	m, err := Normalize(data, t.filter)
	t.parentsMu.Unlock()
	if err == nil {
		t.watch.track(ingressapi.ConversationRef{ChannelID: m.ChannelID, Kind: m.ChannelKind, GuildID: m.GuildID, ParentID: m.ParentID}, m.MessageID)
	}
	if errors.Is(err, ErrSkip) {
		if errors.Is(err, errNoContent) {
			t.noContent.Do(func() {
				t.log.Warn("a message arrived without text or attachments: is the privileged MESSAGE CONTENT intent enabled for this bot (Developer Portal → Bot)? Without it only DMs and mentions carry text")
			})
		}
		return
	}
	if err != nil {
		t.log.Warn("gateway: message event refused", "error", err)
		return
	}
	if ok, first := t.flood.allow(m); !ok {
		if first {
			t.rateLimited.Add(1)
		}
		return
	}
	t.enqueue(t.ctx, m)
}

// enqueue queues m for admission: a DM in the urgent lane (when it has
// room), the rest in order.
func (t *transport) enqueue(ctx context.Context, m ingressapi.Message) {
	if m.ChannelKind == ingressapi.KindDM {
		select {
		case t.urgent <- m:
			return
		default:
		}
	}
	select {
	case t.queue <- m:
	case <-ctx.Done():
	}
}

// admitLoop admits queued messages in order, in batches of what has
// gathered while the previous batch was committed, retrying each batch until
// the core acknowledges it. It starts after the first hello: a message
// admitted before it would start its conversation's backfill cursor, and the
// hello's backfill would read the live messages queued behind it as ones
// that arrived while klbr-discord was not connected (a false gap notice when
// a page fills).
func (t *transport) admitLoop(ctx context.Context) {
	select {
	case <-t.helloed:
	case <-ctx.Done():
		return
	}
	batch := make([]ingressapi.Message, 0, ingressapi.MaxBatch)
	for {
		batch = batch[:0]
		select {
		case m := <-t.urgent:
			batch = append(batch, m)
		default:
			select {
			case m := <-t.urgent:
				batch = append(batch, m)
			case m := <-t.queue:
				batch = append(batch, m)
			case <-ctx.Done():
				return
			}
		}
		// DMs first, then what else gathered while the previous batch was
		// committed.
	urgent:
		for len(batch) < ingressapi.MaxBatch {
			select {
			case m := <-t.urgent:
				batch = append(batch, m)
			default:
				break urgent
			}
		}
	gather:
		for len(batch) < ingressapi.MaxBatch {
			select {
			case m := <-t.queue:
				batch = append(batch, m)
			default:
				break gather
			}
		}
		t.admit(ctx, batch, true)
	}
}

// admit admits batch, retrying until the core acknowledges it. A live
// batch's messages of a channel with a catch-up due or running are marked
// out of order.
func (t *transport) admit(ctx context.Context, batch []ingressapi.Message, live bool) {
	if live {
		for i := range batch {
			batch[i].OutOfOrder = t.order.outOfOrder(batch[i].ChannelID)
		}
	}
	backoff := 50 * time.Millisecond
	for {
		resp, err := t.core.Admit(ctx, ingressapi.AdmitRequest{Messages: batch})
		if err == nil {
			t.link.ok()
			for i, r := range resp.Results {
				if r.Error != nil {
					t.dropped.Add(1)
					t.log.Warn("ingress refused a message", "message_id", batch[i].MessageID, "error", r.Error.Message)
				} else {
					t.admitted.Add(1)
					if !r.Duplicate {
						for _, a := range batch[i].Attachments {
							t.fetch.add(ctx, fetchJob{MessageID: batch[i].MessageID, ChannelID: batch[i].ChannelID, ID: a.ID,
								Filename: a.Filename, ContentType: a.ContentType, Size: a.Size, URL: a.URL})
						}
					}
				}
			}
			return
		}
		var se *ingressapi.StatusError
		if errors.As(err, &se) && se.Permanent() {
			t.dropped.Add(uint64(len(batch)))
			t.log.Error("ingress refused a batch", "messages", len(batch), "error", err)
			return
		}
		if ctx.Err() != nil {
			return
		}
		t.link.failed(err)
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return
		}
		backoff = min(backoff*2, 2*time.Second)
	}
}

// performLoop says hello (reconciling effects a dead transport left
// attempting), then claims and performs effects and reads until ctx ends.
func (t *transport) performLoop(ctx context.Context) {
	// Evidence for an ambiguous send needs our own id: wait for the gateway.
	select {
	case <-t.ready:
	case <-ctx.Done():
		return
	}
hello:
	var hello ingressapi.HelloResponse
	if err := t.retry(ctx, func() (err error) {
		hello, err = t.core.Hello(ctx, ingressapi.HelloRequest{Instance: t.cfg.Instance})
		return err
	}); err != nil {
		if ingressapi.Fenced(err) {
			ferr := fmt.Errorf("%w: %w", ErrFenced, err)
			t.fenced.Store(&ferr)
			t.log.Error("klbr-core refused this transport: another klbr-discord delivers for its data directory", "error", err)
			t.stop()
		}
		return
	}
	handed := make([]string, len(hello.Conversations))
	for i, c := range hello.Conversations {
		handed[i] = c.ChannelID
	}
	t.order.hello(handed)
	t.wg.Go(func() {
		t.backfill(ctx, hello.Conversations)
		t.discoverOnce.Do(func() { t.discoverThreads(ctx, hello.Conversations) })
	})
	t.helloOnce.Do(func() { close(t.helloed) })
	for _, j := range hello.Fetches {
		t.fetch.add(ctx, j)
	}
	for _, e := range hello.Reconcile {
		t.reportSend(ctx, e, t.reconcile(e))
	}
	for ctx.Err() == nil {
		var cr ingressapi.ClaimResponse
		if err := t.retry(ctx, func() (err error) {
			cr, err = t.core.Claim(ctx, ingressapi.ClaimRequest{Limit: 16, WaitMS: 10000, Gateway: t.stats()})
			return err
		}); err != nil {
			if ingressapi.Fenced(err) {
				t.log.Warn("klbr-core asks for a new hello (it restarted, or another transport took over)", "error", err)
				goto hello
			}
			return
		}
		for _, rd := range cr.Reads {
			msgs, err := history(t.rest, rd.ChannelID, min(max(rd.Limit, 1), ingressapi.MaxReadLimit), rd.Before, rd.After)
			a := ingressapi.ReadAnswer{Messages: msgs}
			if err != nil {
				a.Error = classify(err).Error()
			}
			if err := t.core.AnswerRead(ctx, rd.ID, a); err != nil {
				t.log.Warn("ingress: answering a read", "error", err)
			}
		}
		for _, e := range cr.Effects {
			t.reportSend(ctx, e, t.perform(ctx, e))
		}
		for _, n := range cr.Notify {
			t.notifyHeld(ctx, n)
		}
	}
}

// backfill fetches, for each conversation the core knows, the messages
// after the newest one it has: those that arrived while no transport was
// connected. A full page means more may be missing, and a gap notice says so.
// Messages in channels the core has never seen cannot be found this way.
// Each conversation's live messages are out of order until its backfill is
// admitted; one whose history could not be read stays so until the next
// hello (its cursor stays where the missing messages are).
func (t *transport) backfill(ctx context.Context, convs []ingressapi.ConversationRef) {
	var found, channels int
	for _, c := range convs {
		if ctx.Err() != nil {
			return
		}
		if c.LastMessageID == "" || !snowflake(c.ChannelID) {
			t.order.end(c.ChannelID)
			continue
		}
		t.watch.track(c, c.LastMessageID)
		n, _, err := t.catchUp(ctx, c, c.LastMessageID, false, "while klbr-discord was not connected")
		if err != nil {
			t.log.Warn("backfill: reading a channel's history", "channel", c.ChannelID, "error", classify(err).Error())
			continue
		}
		t.order.end(c.ChannelID)
		if n > 0 {
			found += n
			channels++
		}
	}
	if found > 0 {
		t.log.Info("backfill: messages that arrived while klbr-discord was not connected", "messages", found, "channels", channels)
	}
}

func snowflakeLess(a, b string) bool { return len(a) < len(b) || len(a) == len(b) && a < b }

// retry calls f until it succeeds, fails permanently, or ctx ends.
func (t *transport) retry(ctx context.Context, f func() error) error {
	backoff := 100 * time.Millisecond
	for {
		err := f()
		var se *ingressapi.StatusError
		if err == nil || (errors.As(err, &se) && se.Permanent()) {
			t.link.ok() // klbr-core answered
			return err
		}
		if ctx.Err() == nil {
			t.link.failed(err)
		}
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return ctx.Err()
		}
		backoff = min(backoff*2, 3*time.Second)
	}
}

// reportGrace bounds how long a receipt is still offered once the
// transport is stopping; an effect left unreported stays attempting and the
// next transport reconciles it.
const reportGrace = 15 * time.Second

// report posts a receipt until the core records it: it is evidence. While
// stopping, it keeps trying for reportGrace.
func (t *transport) report(ctx context.Context, id int64, r ingressapi.Receipt) {
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	stop := context.AfterFunc(ctx, func() { time.AfterFunc(reportGrace, cancel) })
	defer stop()
	err := t.retry(rctx, func() error { _, err := t.core.Receipt(rctx, id, r); return err })
	if err != nil {
		t.log.Error("a receipt was not recorded; the next transport reconciles the effect", "effect", id, "state", r.State, "error", err)
	}
}

// Retry bounds of one attempt.
const (
	maxAmbiguousRetries = 2
	maxRateLimitRetries = 3
	maxRetryAfter       = 30 * time.Second
)

// perform carries out one effect and says what happened.
func (t *transport) perform(ctx context.Context, e ingressapi.Effect) ingressapi.Receipt {
	var ambiguous, limited int
	var files *upload
	if e.Kind == "send" && len(e.Files) > 0 {
		// Read once: every attempt sends the same bytes with the same nonce.
		var refused *ingressapi.Receipt
		if files, refused = t.readUpload(ctx, e); refused != nil {
			return *refused
		}
	}
	for {
		var msgID string
		var sent []ingressapi.SentFile
		var err error
		switch {
		case e.Kind == "send" && files != nil:
			msgID, sent, err = sendUpload(t.rest, e, files)
		case e.Kind == "send":
			msgID, err = send(t.rest, e)
		case e.Kind == "react":
			err = react(t.rest, e)
		default:
			return ingressapi.Receipt{State: "failed", ErrorCode: "unsupported", Error: "effect kind " + e.Kind}
		}
		if err == nil {
			return ingressapi.Receipt{State: "confirmed", MessageID: msgID, Evidence: "response", Files: sent}
		}
		ae := classify(err)
		switch {
		case ae.definitive:
			return ingressapi.Receipt{State: "failed", ErrorCode: ae.code, Error: ae.msg}
		case ae.rateLimited:
			limited++
			if limited > maxRateLimitRetries || ae.retryAfter > maxRetryAfter {
				return ingressapi.Receipt{State: "failed", ErrorCode: ae.code,
					Error: fmt.Sprintf("rate limited %d times (retry after %s); nothing was delivered", limited, ae.retryAfter)}
			}
			if !sleep(ctx, ae.retryAfter) {
				return ingressapi.Receipt{State: "failed", ErrorCode: ae.code, Error: "rate limited while klbr-discord stopped; nothing was delivered"}
			}
		default:
			ambiguous++
			if ambiguous > maxAmbiguousRetries || ctx.Err() != nil {
				if e.Kind == "send" {
					return t.evidence(e, fmt.Sprintf("%s after %d attempts: %s", ae.code, ambiguous, ae.msg))
				}
				return ingressapi.Receipt{State: "unknown", ErrorCode: ae.code, Error: ae.msg}
			}
			// The same nonce: Discord answers a repeat with the message it made.
			if !sleep(ctx, time.Duration(ambiguous)*500*time.Millisecond) {
				return t.evidence(e, "klbr-discord stopped during the attempt")
			}
		}
	}
}

// reportSend reports a send's receipt; an unknown one is remembered by its
// nonce, so that the gateway's echo, should it come later, settles it.
func (t *transport) reportSend(ctx context.Context, e ingressapi.Effect, r ingressapi.Receipt) {
	if r.State == "confirmed" && snowflake(r.MessageID) {
		t.watch.seen(e.ChannelID, r.MessageID) // our own message is not a gap
	}
	if r.State == "unknown" && e.Kind == "send" && e.Nonce != "" {
		t.unsettled.add(e.Nonce, e.ID)
		// An echo that arrived since the evidence was gathered is not missed.
		if id, ok := t.echoes.get(e.Nonce); ok {
			if _, mine := t.unsettled.take(e.Nonce); mine {
				r = ingressapi.Receipt{State: "confirmed", MessageID: id, Evidence: "nonce echoed on the gateway"}
			}
		}
	}
	t.report(ctx, e.ID, r)
}

// settleLate reports a send this transport reported unknown as confirmed:
// its nonce arrived on the gateway after the evidence ran out.
func (t *transport) settleLate(effect int64, messageID string) {
	t.log.Info("a send reported unknown is settled by its nonce on the gateway", "effect", effect)
	t.wg.Go(func() {
		t.report(t.ctx, effect, ingressapi.Receipt{State: "confirmed", MessageID: messageID,
			Evidence: "nonce echoed on the gateway after the send was reported unknown"})
	})
}

// reconcile settles an effect a dead transport left attempting.
func (t *transport) reconcile(e ingressapi.Effect) ingressapi.Receipt {
	if e.Kind != "send" {
		return ingressapi.Receipt{State: "unknown", ErrorCode: "interrupted", Error: "klbr-discord died during the attempt"}
	}
	return t.evidence(e, "klbr-discord died during the attempt")
}

// evidence settles an ambiguous send: the nonce seen on the gateway (Discord
// echoes our own message with its nonce), the nonce in recent channel
// history, or exactly one message of ours with the same text from after the
// attempt began. Found, the send is confirmed; otherwise it is unknown, and
// never retried blindly.
func (t *transport) evidence(e ingressapi.Effect, why string) ingressapi.Receipt {
	if id, ok := t.echoes.get(e.Nonce); ok {
		return ingressapi.Receipt{State: "confirmed", MessageID: id, Evidence: "nonce echoed on the gateway"}
	}
	msgs, err := history(t.rest, e.ChannelID, 50, "", "")
	if err != nil {
		return ingressapi.Receipt{State: "unknown", ErrorCode: "interrupted", Error: why + "; channel history could not be read: " + classify(err).Error()}
	}
	var same []ingressapi.HistoryMessage
	for _, m := range msgs {
		if m.Nonce != "" && m.Nonce == e.Nonce {
			return ingressapi.Receipt{State: "confirmed", MessageID: m.MessageID, Evidence: "nonce in channel history"}
		}
		if m.AuthorID == t.bot() && m.Content == e.Text && !e.ClaimedAt.IsZero() && !m.OccurredAt.Before(e.ClaimedAt.Add(-2*time.Second)) {
			same = append(same, m)
		}
	}
	if len(same) == 1 {
		return ingressapi.Receipt{State: "confirmed", MessageID: same[0].MessageID, Evidence: "our message with its text in channel history"}
	}
	detail := "its nonce is not in the last 50 messages"
	if len(same) > 1 {
		detail = fmt.Sprintf("%d messages of ours carry its text; which one is this send cannot be told", len(same))
	}
	return ingressapi.Receipt{State: "unknown", ErrorCode: "interrupted", Error: why + "; " + detail}
}

func sleep(ctx context.Context, d time.Duration) bool {
	select {
	case <-time.After(d):
		return true
	case <-ctx.Done():
		return false
	}
}
