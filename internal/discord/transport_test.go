package discord

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/admission"
	"github.com/klbr-dev/klbr/internal/artifacts"
	"github.com/klbr-dev/klbr/internal/discordtest"
	"github.com/klbr-dev/klbr/internal/ingress"
	"github.com/klbr-dev/klbr/internal/ingress/ingressapi"
	"github.com/klbr-dev/klbr/internal/session"
	"github.com/klbr-dev/klbr/internal/store"
	"github.com/klbr-dev/klbr/internal/unixsock"
)

const testToken = "test-token-SECRET-6b1f"

// The test binary doubles as a klbr-discord process for the kill tests.
func TestMain(m *testing.M) {
	if os.Getenv("KLBR_DISCORD_CHILD") == "1" {
		ctx, stop := signalContext()
		defer stop()
		err := Run(ctx, Config{Token: testToken, APIBase: os.Getenv("KLBR_DISCORD_API"), IngressSocket: os.Getenv("KLBR_INGRESS_SOCKET"),
			Log: slog.New(slog.NewTextHandler(os.Stderr, nil))})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func signalContext() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	return ctx, cancel
}

// core is klbr-core's side: a real store, admission and ingress server on a real socket.
type core struct {
	dir, socket string
	store       *store.Store
	server      *ingress.Server
	artifacts   *artifacts.Store
	stop        func()
}

func startCore(t testing.TB, dir string) *core {
	t.Helper()
	return startCoreWith(t, dir, nil)
}

// startCoreWith is startCore with the ingress configuration adjusted.
func startCoreWith(t testing.TB, dir string, adjust func(*ingress.Config)) *core {
	t.Helper()
	st, err := store.Open(context.Background(), dir, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	st.Write(context.Background(), func(tx *store.Tx) error { _, err := tx.EnsureSession(session.DefaultID); return err })
	arts, err := artifacts.New(filepath.Join(dir, "artifacts"))
	if err != nil {
		t.Fatal(err)
	}
	icfg := ingress.Config{Store: st, Admit: admission.New(st, session.NewManager(st), nil, nil), Artifacts: func() *artifacts.Store { return arts }}
	if adjust != nil {
		adjust(&icfg)
	}
	srv := ingress.New(icfg)
	sock := filepath.Join(dir, "ingress.sock")
	l, err := unixsock.Listen(sock, 0o660)
	if err != nil {
		t.Fatal(err)
	}
	hs := srv.HTTPServer()
	done := make(chan struct{})
	go func() { hs.Serve(l); close(done) }()
	c := &core{dir: dir, socket: sock, store: st, server: srv, artifacts: arts}
	var once sync.Once
	c.stop = func() {
		once.Do(func() {
			srv.Close()
			hs.Close()
			<-done
			st.Close()
		})
	}
	t.Cleanup(c.stop)
	return c
}

// logBuffer collects the transport's log, to prove the token stays out of it.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// runTransport runs the transport in this process until the test ends.
func runTransport(t testing.TB, fake *discordtest.Fake, socket string) (*logBuffer, <-chan error) {
	t.Helper()
	return runTransportWith(t, fake, socket, nil)
}

// runTransportWith is runTransport with the config adjusted by adjust.
func runTransportWith(t testing.TB, fake *discordtest.Fake, socket string, adjust func(*Config)) (*logBuffer, <-chan error) {
	t.Helper()
	logs := &logBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		cfg := Config{Token: testToken, APIBase: fake.APIBase(), IngressSocket: socket, Log: slog.New(slog.NewTextHandler(logs, nil))}
		if adjust != nil {
			adjust(&cfg)
		}
		errc <- Run(ctx, cfg)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(reportGrace + 10*time.Second):
			// A receipt in flight is offered for reportGrace after the stop
			// (the core may be gone already: cleanups run in reverse).
			t.Error("the transport did not stop")
		}
		if strings.Contains(logs.String(), testToken) {
			t.Error("the token appeared in the transport's log")
		}
	})
	waitFor(t, "the gateway session", fake.Connected)
	return logs, errc
}

func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func pending(t testing.TB, c *core) []store.PendingInput {
	p, err := c.store.PendingInputs(context.Background(), session.DefaultID)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func enqueueSend(t *testing.T, c *core, alias, key, text string, item int64) store.Effect {
	t.Helper()
	conv, err := c.store.ConversationByRef(context.Background(), alias)
	if err != nil {
		t.Fatal(err)
	}
	var e store.Effect
	if err := c.store.Write(context.Background(), func(tx *store.Tx) (err error) {
		e, err = tx.EnqueueEffect(store.NewEffect{Session: session.DefaultID, Kind: store.EffectSend, ConversationID: conv.ID,
			IdempotencyKey: key, Nonce: "n" + strings.ReplaceAll(key, "/", ""), Text: text, ItemID: item})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	c.server.Kick()
	return e
}

func settled(t *testing.T, c *core, id int64) store.Effect {
	t.Helper()
	var e store.Effect
	waitFor(t, fmt.Sprintf("effect %d to settle", id), func() bool {
		e, _ = c.store.Effect(context.Background(), id)
		return e.State == store.EffectConfirmed || e.State == store.EffectFailed || e.State == store.EffectUnknown
	})
	return e
}

func TestAmbientRoomDirectedDM(t *testing.T) {
	dir := t.TempDir()
	c := startCore(t, dir)
	fake := discordtest.New("99")
	defer fake.Close()
	runTransport(t, fake, c.socket)

	fake.Dispatch("MESSAGE_CREATE", discordtest.Message("1001", "10", "7", "5", "anyone seen the build?"))
	fake.Dispatch("MESSAGE_CREATE", discordtest.Message("1002", "11", "7", "6", "lunch?"))
	fake.Dispatch("MESSAGE_CREATE", discordtest.Message("1003", "20", "", "5", "hey, a question for you"))
	mention := discordtest.Message("1004", "11", "7", "6", "<@99> are you there")
	mention["mentions"] = []any{map[string]any{"id": "99"}}
	fake.Dispatch("MESSAGE_CREATE", mention)
	bot := discordtest.Message("1005", "10", "7", "8", "beep")
	bot["author"].(map[string]any)["bot"] = true
	fake.Dispatch("MESSAGE_CREATE", bot)
	fake.Dispatch("MESSAGE_CREATE", discordtest.Message("1006", "10", "7", "99", "my own echo"))
	fake.Dispatch("TYPING_START", map[string]any{"channel_id": "10"})
	waitFor(t, "four inputs", func() bool { return len(pending(t, c)) == 4 })
	ctx := context.Background()
	items, _ := c.store.AttentionItems(ctx, session.DefaultID, nil, 10)
	if len(items) != 2 {
		t.Fatalf("%d attention items, want the DM and the mention", len(items))
	}
	var dm, men store.AttentionItem
	for _, it := range items {
		if it.MessageID == "1003" {
			dm = it
		} else {
			men = it
		}
	}
	// The agent ignores the mention and answers the DM, in the DM.
	if err := c.store.Write(ctx, func(tx *store.Tx) error {
		_, err := tx.Mark(men.ID, store.ItemIgnored, store.OriginModel, "nothing to add", 0)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	e := enqueueSend(t, c, dm.Conversation, "x1/1", "sure, ask away", dm.ID)
	got := settled(t, c, e.ID)
	sent := fake.Sent()
	if got.State != store.EffectConfirmed || len(sent) != 1 || sent[0].ChannelID != "20" || sent[0].ID != got.MessageID || sent[0].ReplyTo != "" {
		t.Fatalf("effect %+v, fake saw %+v; want one plain message in the DM channel 20", got, sent)
	}
	dmNow, _ := c.store.AttentionItem(ctx, dm.ID)
	menNow, _ := c.store.AttentionItem(ctx, men.ID)
	if dmNow.Status != store.ItemActed || menNow.Status != store.ItemIgnored {
		t.Fatalf("dm %s, mention %s; want acted and ignored", dmNow.Status, menNow.Status)
	}
	// Restart the core: the ignored mention stays ignored.
	c.stop()
	c = startCore(t, dir)
	menNow, _ = c.store.AttentionItem(ctx, men.ID)
	if menNow.Status != store.ItemIgnored || menNow.DecisionOrigin != store.OriginModel {
		t.Fatalf("after restart the mention is %s by %s", menNow.Status, menNow.DecisionOrigin)
	}
}

func TestReplayedEventsAndACoreRestartLoseNothing(t *testing.T) {
	dir := t.TempDir()
	c := startCore(t, dir)
	fake := discordtest.New("99")
	defer fake.Close()
	runTransport(t, fake, c.socket)
	for i := range 5 {
		fake.Dispatch("MESSAGE_CREATE", discordtest.Message(fmt.Sprint(2000+i), "10", "7", "5", fmt.Sprint("m", i)))
	}
	waitFor(t, "five inputs", func() bool { return len(pending(t, c)) == 5 })
	// The connection drops; the transport resumes; the fake replays from seq 0-ish.
	fake.CloseGateway(4000)
	waitFor(t, "a resume", func() bool { _, r := fake.Counts(); return r >= 1 && fake.Connected() })
	// klbr-core goes away while messages keep arriving.
	c.stop()
	for i := 5; i < 10; i++ {
		fake.Dispatch("MESSAGE_CREATE", discordtest.Message(fmt.Sprint(2000+i), "10", "7", "5", fmt.Sprint("m", i)))
	}
	time.Sleep(200 * time.Millisecond)
	c = startCore(t, dir)
	waitFor(t, "ten inputs", func() bool { return len(pending(t, c)) == 10 })
	time.Sleep(200 * time.Millisecond)
	if n := len(pending(t, c)); n != 10 {
		t.Fatalf("%d inputs, want exactly 10", n)
	}
}

func TestFailedSendsAreRecordedHonestly(t *testing.T) {
	c := startCore(t, t.TempDir())
	fake := discordtest.New("99")
	defer fake.Close()
	var mu sync.Mutex
	script := map[string][]int{} // nonce → statuses to answer before accepting (0 = accept)
	fake.OnSend = func(ch, nonce string) (int, float64) {
		mu.Lock()
		defer mu.Unlock()
		s := script[nonce]
		if len(s) == 0 {
			return 0, 0
		}
		script[nonce] = s[1:]
		return s[0], 0.05
	}
	runTransport(t, fake, c.socket)
	fake.Dispatch("MESSAGE_CREATE", discordtest.Message("3001", "30", "", "5", "hi"))
	waitFor(t, "the DM", func() bool { return len(pending(t, c)) == 1 })
	tests := []struct {
		name    string
		script  []int
		want    string
		wantMsg int // messages the fake holds afterwards, cumulative
	}{
		{"forbidden", []int{403}, store.EffectFailed, 0},
		{"rate limited twice, then accepted", []int{429, 429}, store.EffectConfirmed, 1},
		{"rate limited past the bound", []int{429, 429, 429, 429, 429}, store.EffectFailed, 1},
		{"server errors past the bound, nonce not found", []int{500, 500, 500, 500}, store.EffectUnknown, 1},
		{"one server error, then accepted", []int{502}, store.EffectConfirmed, 2},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			key := fmt.Sprintf("x9/%d", i)
			mu.Lock()
			script["n"+strings.ReplaceAll(key, "/", "")] = tc.script
			mu.Unlock()
			e := settled(t, c, enqueueSend(t, c, "d1", key, "reply "+tc.name, 0).ID)
			if e.State != tc.want || len(fake.Sent()) != tc.wantMsg {
				t.Fatalf("state %s (%s %s), fake holds %d; want %s and %d", e.State, e.ErrorCode, e.Error, len(fake.Sent()), tc.want, tc.wantMsg)
			}
		})
	}
	// Not said versus said: only confirmed sends are in the speech lane as sent.
	recs, _ := c.store.Records(context.Background(), session.DefaultID, 0, 100)
	var sentRecs int
	for _, r := range recs {
		if r.Kind == "discord.sent" {
			sentRecs++
		}
	}
	if sentRecs != 2 {
		t.Fatalf("%d discord.sent records, want 2 (the failed and unknown ones are not delivered)", sentRecs)
	}
}

func TestFatalCloseStopsWithAClearError(t *testing.T) {
	c := startCore(t, t.TempDir())
	fake := discordtest.New("99")
	defer fake.Close()
	_, errc := runTransport(t, fake, c.socket)
	fake.CloseGateway(4014)
	select {
	case err := <-errc:
		var fe *FatalError
		if !errors.As(err, &fe) || fe.Code != 4014 || !strings.Contains(fe.Msg, "MESSAGE CONTENT") {
			t.Fatalf("Run returned %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the transport kept going after a disallowed-intents close")
	}
}

// startChild runs the transport as a real process.
func startChild(t *testing.T, fake *discordtest.Fake, socket string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "KLBR_DISCORD_CHILD=1", "KLBR_DISCORD_API="+fake.APIBase(), "KLBR_INGRESS_SOCKET="+socket)
	var out bytes.Buffer
	cmd.Stderr = &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if strings.Contains(out.String(), testToken) {
			t.Error("the token appeared in klbr-discord's output")
		}
	})
	return cmd
}

func TestKilledAtTheWorstInstant(t *testing.T) {
	c := startCore(t, t.TempDir())
	fake := discordtest.New("99")
	defer fake.Close()
	// Discord accepts the send; klbr-discord dies before it hears the answer.
	var victim atomic.Pointer[exec.Cmd]
	fake.AfterAccept = func(discordtest.Sent) int {
		if cmd := victim.Swap(nil); cmd != nil {
			cmd.Process.Signal(syscall.SIGKILL)
			cmd.Wait()
		}
		return 0
	}
	child := startChild(t, fake, c.socket)
	waitFor(t, "the child's gateway session", fake.Connected)
	fake.Dispatch("MESSAGE_CREATE", discordtest.Message("4001", "40", "", "5", "ping"))
	waitFor(t, "the DM", func() bool { return len(pending(t, c)) == 1 })
	items, _ := c.store.AttentionItems(context.Background(), session.DefaultID, nil, 10)
	victim.Store(child)
	e := enqueueSend(t, c, "d1", "x5/1", "pong", items[0].ID)
	waitFor(t, "the accepted send", func() bool { return len(fake.Sent()) == 1 })
	waitFor(t, "the kill", func() bool { return victim.Load() == nil })
	time.Sleep(200 * time.Millisecond)
	if got, _ := c.store.Effect(context.Background(), e.ID); got.State != store.EffectAttempting {
		t.Fatalf("after the kill the effect is %s, want attempting", got.State)
	}
	startChild(t, fake, c.socket)
	got := settled(t, c, e.ID)
	if got.State != store.EffectConfirmed || got.Evidence != "our message with its text in channel history" || got.MessageID != fake.Sent()[0].ID {
		t.Fatalf("effect %+v; want confirmed by our message in history", got)
	}
	if n := len(fake.Sent()); n != 1 {
		t.Fatalf("the fake saw %d messages, want exactly 1", n)
	}
	it, _ := c.store.AttentionItem(context.Background(), items[0].ID)
	if it.Status != store.ItemActed {
		t.Fatalf("item is %s", it.Status)
	}
}

func TestGapsMalformedFramesReplyReactAndBackread(t *testing.T) {
	c := startCore(t, t.TempDir())
	fake := discordtest.New("99")
	defer fake.Close()
	runTransport(t, fake, c.socket)
	ctx := context.Background()

	// Malformed payloads: a frame that is not JSON, a message whose data is
	// garbage, an event type nobody knows. Nothing is admitted for them, and
	// the next message still is.
	fake.DispatchRaw([]byte("{not json"))
	waitFor(t, "a reconnect after the malformed frame", func() bool { s, r := fake.Counts(); return s+r >= 2 && fake.Connected() })
	fake.Dispatch("MESSAGE_CREATE", map[string]any{"id": "x", "channel_id": []int{1}})
	fake.Dispatch("GUILD_SCHEDULED_EVENT_USER_ADD", map[string]any{"weird": true})
	msg := discordtest.Message("7001", "70", "", "5", "first")
	msg["attachments"] = []any{map[string]any{"id": "71", "filename": "cat.png", "content_type": "image/png", "size": 1234, "url": "https://cdn.example/cat.png"}}
	fake.Dispatch("MESSAGE_CREATE", msg)
	waitFor(t, "the message after the garbage", func() bool { return len(pending(t, c)) == 1 })

	// The session is invalidated: a new one is identified and a gap notice admitted.
	before, _ := fake.Counts()
	fake.InvalidateSession()
	waitFor(t, "the gap notice", func() bool { return len(pending(t, c)) == 2 })
	waitFor(t, "a new session", func() bool { s, _ := fake.Counts(); return s > before && fake.Connected() })
	recs, _ := c.store.Records(ctx, session.DefaultID, 0, 100)
	var gap bool
	for _, r := range recs {
		if strings.Contains(string(r.Content), `"source_key":"discord-gap:`) && strings.Contains(string(r.Content), "may be missing") {
			gap = true
		}
	}
	if !gap {
		t.Fatal("no gap notice was admitted after the failed resume")
	}

	// The channel advances past the DM: the answer carries a reply reference.
	fake.Dispatch("MESSAGE_CREATE", discordtest.Message("7002", "70", "", "5", "second"))
	waitFor(t, "the second DM", func() bool { return len(pending(t, c)) == 3 })
	items, _ := c.store.AttentionItems(ctx, session.DefaultID, nil, 10)
	var first int64
	for _, it := range items {
		if it.MessageID == "7001" {
			first = it.ID
		}
	}
	e := settled(t, c, enqueueSend(t, c, "d1", "x7/1", "about the first", first).ID)
	if sent := fake.Sent(); e.State != store.EffectConfirmed || len(sent) != 1 || sent[0].ReplyTo != "7001" {
		t.Fatalf("effect %+v, fake %+v: want a reply to 7001", e, sent)
	}
	// A reaction.
	conv, _ := c.store.ConversationByRef(ctx, "d1")
	var r store.Effect
	c.store.Write(ctx, func(tx *store.Tx) (err error) {
		r, err = tx.EnqueueEffect(store.NewEffect{Session: session.DefaultID, Kind: store.EffectReact, ConversationID: conv.ID,
			IdempotencyKey: "x7/2", Nonce: "nr", Emoji: "❤️", Target: "7002"})
		return err
	})
	c.server.Kick()
	if r = settled(t, c, r.ID); r.State != store.EffectConfirmed || len(fake.Reactions()) != 1 || fake.Reactions()[0] != "70/7002/❤️" {
		t.Fatalf("reaction %+v, fake %v", r, fake.Reactions())
	}
	// A backread passes through to Discord and stores nothing.
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	hist, err := c.server.Read(rctx, ingressapi.Read{ChannelID: "70", Limit: 10})
	if err != nil || len(hist) != 3 || hist[0].Content != "about the first" || !hist[0].Bot || hist[2].MessageID != "7001" {
		t.Fatalf("history %+v %v", hist, err)
	}
	if n := len(pending(t, c)); n != 3 {
		t.Fatalf("the backread admitted something: %d inputs", n)
	}
}

// Discord accepts a send but answers 500: the retry carries the same nonce,
// enforce_nonce answers with the message already made, and the fake holds
// one message. Retries preserve identity.
func TestAcceptedThenServerErrorIsNotSentTwice(t *testing.T) {
	c := startCore(t, t.TempDir())
	fake := discordtest.New("99")
	defer fake.Close()
	var once atomic.Bool
	fake.AfterAccept = func(discordtest.Sent) int {
		if once.CompareAndSwap(false, true) {
			return 500
		}
		return 0
	}
	runTransport(t, fake, c.socket)
	fake.Dispatch("MESSAGE_CREATE", discordtest.Message("9001", "90", "", "5", "hi"))
	waitFor(t, "the DM", func() bool { return len(pending(t, c)) == 1 })
	e := settled(t, c, enqueueSend(t, c, "d1", "x9/1", "once only", 0).ID)
	sent := fake.Sent()
	if e.State != store.EffectConfirmed || len(sent) != 1 || e.MessageID != sent[0].ID {
		t.Fatalf("effect %+v, fake holds %d", e, len(sent))
	}
	if e.Attempts != 1 {
		t.Fatalf("the effect was claimed %d times; its retries belong to one attempt", e.Attempts)
	}
}

// klbr-discord restarts: what arrived meanwhile in conversations the core
// knows is fetched from history (a mention still becomes an item); more than
// a page of it is recorded as a gap; a channel never seen stays unseen.
func TestRestartedTransportBackfillsKnownConversations(t *testing.T) {
	c := startCore(t, t.TempDir())
	fake := discordtest.New("99")
	defer fake.Close()
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(runCtx, Config{Token: testToken, APIBase: fake.APIBase(), IngressSocket: c.socket})
	}()
	waitFor(t, "the first gateway session", fake.Connected)
	fake.Dispatch("MESSAGE_CREATE", discordtest.Message("10001", "10", "7", "5", "before"))
	fake.Dispatch("MESSAGE_CREATE", discordtest.Message("10002", "20", "", "5", "a dm before"))
	fake.Dispatch("MESSAGE_CREATE", discordtest.Message("10003", "11", "7", "5", "busy channel before"))
	waitFor(t, "three inputs", func() bool { return len(pending(t, c)) == 3 })
	cancel()
	<-done
	waitFor(t, "the gateway closed", func() bool { return !fake.Connected() })

	// While klbr-discord is down.
	fake.Dispatch("MESSAGE_CREATE", discordtest.Message("10004", "10", "7", "6", "missed 1"))
	mention := discordtest.Message("10005", "10", "7", "6", "<@99> missed mention")
	mention["mentions"] = []any{map[string]any{"id": "99"}}
	fake.Dispatch("MESSAGE_CREATE", mention)
	fake.Dispatch("MESSAGE_CREATE", discordtest.Message("10006", "20", "", "5", "missed dm"))
	fake.Dispatch("MESSAGE_CREATE", discordtest.Message("10007", "30", "7", "5", "a channel never seen"))
	for i := range 101 {
		fake.Dispatch("MESSAGE_CREATE", discordtest.Message(fmt.Sprint(20000+i), "11", "7", "5", "flood"))
	}

	ctx := context.Background()
	runTransport(t, fake, c.socket)
	// 3 + 3 missed + 100 of the flood + 1 gap notice.
	waitFor(t, "the backfill", func() bool { return len(pending(t, c)) == 107 })
	time.Sleep(200 * time.Millisecond)
	if n := len(pending(t, c)); n != 107 {
		t.Fatalf("%d inputs after the backfill, want 107", n)
	}
	items, _ := c.store.AttentionItems(ctx, session.DefaultID, nil, 10)
	var gotMention, gotDM bool
	for _, it := range items {
		gotMention = gotMention || it.MessageID == "10005"
		gotDM = gotDM || it.MessageID == "10006"
	}
	if !gotMention || !gotDM {
		t.Fatalf("backfilled mention %v, dm %v: both must be items (%+v)", gotMention, gotDM, items)
	}
	var gap bool
	recs, _ := c.store.Records(ctx, session.DefaultID, 0, 1000)
	for _, r := range recs {
		if strings.Contains(string(r.Content), "discord:10007") {
			t.Fatal("a message of a channel never seen was admitted")
		}
		gap = gap || strings.Contains(string(r.Content), "channel 11 while klbr-discord was not connected")
	}
	if !gap {
		t.Fatal("no gap notice for the channel with more than a page of missed messages")
	}
}

// A message written before our newest send in a conversation, which no
// transport got admitted (klbr-discord stopped with it still queued), is
// read back by the next transport: our own sends never move the backfill's
// cursor. The one-hour soak lost DMs this way: the cursor was our reply's id.
func TestBackfillReadsBehindOurOwnNewestSend(t *testing.T) {
	c := startCore(t, t.TempDir())
	fake := discordtest.New("99")
	defer fake.Close()
	stop := runTransportStoppable(t, fake, c.socket, nil)
	waitFor(t, "the gateway session", fake.Connected)
	fake.Dispatch("MESSAGE_CREATE", discordtest.Message("10001", "20", "", "5", "hello"))
	waitFor(t, "the first dm", func() bool { return len(pending(t, c)) == 1 })
	// The reply's id (the fake's, 9000…) is newer than 10002's.
	e := enqueueSend(t, c, "d1", "reply/1", "hi", 0)
	if got := settled(t, c, e.ID); got.State != store.EffectConfirmed {
		t.Fatalf("the reply: %+v", got)
	}
	stop()
	waitFor(t, "the gateway closed", func() bool { return !fake.Connected() })

	fake.Dispatch("MESSAGE_CREATE", discordtest.Message("10002", "20", "", "5", "written before the reply, never admitted"))
	runTransport(t, fake, c.socket)
	waitFor(t, "the message behind our reply", func() bool { return len(pending(t, c)) == 2 })
}

// A live message that arrives while its channel's backfill is read is
// admitted at once but does not move the backfill cursor: a transport
// stopped before the backfill was admitted leaves the older message for the
// next one to read.
func TestALiveMessageDoesNotOvertakeTheBackfill(t *testing.T) {
	c := startCore(t, t.TempDir())
	fake := discordtest.New("99")
	defer fake.Close()
	cursor := func() string {
		t.Helper()
		conv, err := c.store.ConversationByRef(context.Background(), "d1")
		if err != nil {
			t.Fatal(err)
		}
		return conv.LastInboundID
	}
	stop := runTransportStoppable(t, fake, c.socket, nil)
	fake.Dispatch("MESSAGE_CREATE", discordtest.Message("10001", "20", "", "5", "hello"))
	waitFor(t, "the first dm", func() bool { return len(pending(t, c)) == 1 })
	stop()
	fake.Dispatch("MESSAGE_CREATE", discordtest.Message("10002", "20", "", "5", "written while no transport ran"))

	// The next transport's read of the DM's history hangs.
	reading, release := make(chan struct{}, 1), make(chan struct{})
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	defer unblock() // before the fake closes: it waits for its handlers
	fake.SetOnRequest(func(r *http.Request) int {
		if r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/channels/20/messages") {
			select {
			case reading <- struct{}{}:
			default:
			}
			<-release
		}
		return 0
	})
	stop = runTransportStoppable(t, fake, c.socket, nil)
	select {
	case <-reading:
	case <-time.After(15 * time.Second):
		t.Fatal("the backfill never read the DM's history")
	}
	fake.Dispatch("MESSAGE_CREATE", discordtest.Message("10003", "20", "", "5", "live, during the backfill"))
	waitFor(t, "the live dm", func() bool { return len(pending(t, c)) == 2 })
	if got := cursor(); got != "10001" {
		t.Fatalf("the cursor moved to %s before the backfill was admitted, want 10001", got)
	}
	stop() // before the backfill was admitted
	unblock()
	fake.SetOnRequest(nil)

	runTransport(t, fake, c.socket)
	waitFor(t, "the message written while no transport ran", func() bool { return len(pending(t, c)) == 3 })
	waitFor(t, "the cursor at the newest", func() bool { return cursor() == "10003" })
}

// Discord refuses content over 2,000 code points with 50035 (an invalid
// form body): the effect fails with the field's own reason, and nothing was
// delivered. 2,000 CJK characters (6,000 bytes) are accepted.
func TestOverlongContentIsRefusedWithTheFieldsReason(t *testing.T) {
	c := startCore(t, t.TempDir())
	fake := discordtest.New("99")
	defer fake.Close()
	runTransport(t, fake, c.socket)
	fake.Dispatch("MESSAGE_CREATE", discordtest.Message("9101", "91", "", "5", "hi"))
	waitFor(t, "the DM", func() bool { return len(pending(t, c)) == 1 })
	ok := settled(t, c, enqueueSend(t, c, "d1", "x9/1", strings.Repeat("漢", 2000), 0).ID)
	if ok.State != store.EffectConfirmed {
		t.Fatalf("2,000 CJK characters: %s %s %s", ok.State, ok.ErrorCode, ok.Error)
	}
	bad := settled(t, c, enqueueSend(t, c, "d1", "x9/2", strings.Repeat("😀", 2001), 0).ID)
	if bad.State != store.EffectFailed || bad.ErrorCode != "http_400" || !strings.Contains(bad.Error, "content: Must be 2000 or fewer in length") {
		t.Fatalf("2,001 emoji: %s %s %q; want failed with the content field's reason", bad.State, bad.ErrorCode, bad.Error)
	}
	if n := len(fake.Sent()); n != 1 {
		t.Fatalf("the fake holds %d messages, want 1", n)
	}
}
