package discord

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bwmarrin/discordgo"
	"github.com/gorilla/websocket"
)

// Intents klbr-discord asks for: guilds, guild messages, direct messages and
// the privileged message content.
const Intents = discordgo.IntentsGuilds | discordgo.IntentsGuildMessages | discordgo.IntentsDirectMessages | discordgo.IntentsMessageContent

// FatalError is a close the gateway will not take back by reconnecting
// (a bad token, intents that are not allowed): klbr-discord exits with it.
type FatalError struct {
	Code int
	Msg  string
}

func (e *FatalError) Error() string {
	return fmt.Sprintf("discord gateway closed with %d: %s", e.Code, e.Msg)
}

// fatalCloses are the close codes on which reconnecting cannot help.
var fatalCloses = map[int]string{
	4004: "authentication failed: the bot token is wrong or was reset; put the current one in the credential file",
	4010: "invalid shard",
	4011: "sharding required: this bot is in too many guilds for one connection",
	4012: "invalid API version",
	4013: "invalid intents",
	4014: "disallowed intents: the privileged MESSAGE CONTENT intent is not enabled for this bot; enable it in the Discord Developer Portal (Bot → Privileged Gateway Intents)",
}

// maxReadyGuilds bounds the guilds taken from READY: one gateway
// connection serves at most 2,500 (past it Discord requires sharding, 4011).
const maxReadyGuilds = 2500

// freshCloses end the session: the next connection identifies anew, and
// events between may be missing.
var freshCloses = map[int]bool{4007: true, 4009: true}

// GatewayEvents is what the gateway hands over.
type GatewayEvents struct {
	// Ready gives our own user id and the guilds READY lists (at most
	// maxReadyGuilds).
	Ready   func(botID string, guilds []string)
	Message func(data json.RawMessage)
	Thread  func(th ThreadCreate)
	// Interaction is a button press (INTERACTION_CREATE).
	Interaction func(ix Interaction)
	// Gap is called when a resume failed and events may be missing.
	Gap func(reason string)
	// State tells connected (true) or not, and counts resumes.
	State func(connected bool, resumed bool)
}

// Gateway keeps one gateway session: identify, heartbeat, resume at the
// session's resume URL, re-identify with a gap notice when the session is
// lost, stop on fatal closes.
type Gateway struct {
	rest   *discordgo.Session
	token  string
	log    *slog.Logger
	ev     GatewayEvents
	dialer *websocket.Dialer

	conn atomic.Pointer[websocket.Conn] // the current connection, for Reconnect

	// Owned by Run's goroutine.
	sessionID string
	resumeURL string
	seq       atomic.Int64 // read by the heartbeat goroutine too
}

// NewGateway returns a Gateway; rest finds the gateway URL (GET {api_base}/gateway).
func NewGateway(rest *discordgo.Session, token string, log *slog.Logger, ev GatewayEvents) *Gateway {
	return &Gateway{rest: rest, token: token, log: log, ev: ev, dialer: &websocket.Dialer{HandshakeTimeout: 15 * time.Second}}
}

type frame struct {
	Op int             `json:"op"`
	D  json.RawMessage `json:"d"`
	S  *int64          `json:"s"`
	T  string          `json:"t"`
}

// Run connects and reconnects until ctx ends (nil) or a fatal close (*FatalError).
func (g *Gateway) Run(ctx context.Context) error {
	backoff := time.Second
	for {
		start := time.Now()
		err := g.session(ctx)
		g.ev.State(false, false)
		if ctx.Err() != nil {
			return nil
		}
		var fe *FatalError
		if errors.As(err, &fe) {
			return err
		}
		if time.Since(start) > time.Minute {
			backoff = time.Second
		}
		wait := backoff + time.Duration(rand.Int64N(int64(backoff/2)+1))
		g.log.Warn("gateway disconnected; reconnecting", "error", err, "in", wait.Round(time.Millisecond))
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return nil
		}
		backoff = min(backoff*2, 2*time.Minute)
	}
}

// session runs one connection.
func (g *Gateway) session(ctx context.Context) error {
	resuming := g.sessionID != "" && g.resumeURL != ""
	base := g.resumeURL
	if !resuming {
		u, err := g.rest.Gateway()
		if err != nil {
			return fmt.Errorf("GET /gateway: %w", err)
		}
		base = u
	}
	u, err := url.Parse(base)
	if err != nil {
		return fmt.Errorf("gateway url: %w", err)
	}
	q := u.Query()
	q.Set("v", discordgo.APIVersion)
	q.Set("encoding", "json")
	u.RawQuery = q.Encode()
	conn, _, err := g.dialer.DialContext(ctx, u.String(), nil)
	if err != nil {
		return fmt.Errorf("dial gateway: %w", err)
	}
	conn.SetReadLimit(MaxEventBytes + 4096)
	g.conn.Store(conn)
	defer g.conn.CompareAndSwap(conn, nil)
	var wmu sync.Mutex // guards writes on conn
	write := func(v any) error {
		wmu.Lock()
		defer wmu.Unlock()
		conn.SetWriteDeadline(time.Now().Add(10 * time.Second))
		return conn.WriteJSON(v)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	defer conn.Close()

	var hello frame
	conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	if err := conn.ReadJSON(&hello); err != nil || hello.Op != 10 {
		return fmt.Errorf("gateway hello: op %d, %v", hello.Op, err)
	}
	var h struct {
		HeartbeatInterval int64 `json:"heartbeat_interval"`
	}
	if err := json.Unmarshal(hello.D, &h); err != nil || h.HeartbeatInterval <= 0 {
		return fmt.Errorf("gateway hello: malformed: %s", clipBytes(string(hello.D), 200))
	}
	interval := time.Duration(h.HeartbeatInterval) * time.Millisecond
	if resuming {
		err = write(map[string]any{"op": 6, "d": map[string]any{"token": g.token, "session_id": g.sessionID, "seq": g.seq.Load()}})
	} else {
		err = g.identify(write)
	}
	if err != nil {
		return fmt.Errorf("gateway: %w", err)
	}
	acked := make(chan struct{}, 1)
	acked <- struct{}{}
	go func() { // heartbeats; a missed ack means a zombie connection
		t := time.NewTimer(time.Duration(rand.Int64N(int64(interval))))
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			select {
			case <-acked:
			default:
				g.log.Warn("gateway: heartbeat not acknowledged; reconnecting")
				conn.Close()
				return
			}
			if err := write(map[string]any{"op": 1, "d": g.seqOrNil()}); err != nil {
				conn.Close()
				return
			}
			t.Reset(interval)
		}
	}()
	for {
		conn.SetReadDeadline(time.Now().Add(interval + 30*time.Second))
		var f frame
		if err := conn.ReadJSON(&f); err != nil {
			var ce *websocket.CloseError
			if errors.As(err, &ce) {
				if msg, ok := fatalCloses[ce.Code]; ok {
					return &FatalError{Code: ce.Code, Msg: msg}
				}
				if freshCloses[ce.Code] {
					g.lose(fmt.Sprintf("gateway closed the session (%d)", ce.Code))
				}
			}
			var se *json.SyntaxError
			if errors.As(err, &se) {
				g.log.Warn("gateway: malformed frame; reconnecting")
			}
			return err
		}
		if f.S != nil {
			g.seq.Store(*f.S)
		}
		switch f.Op {
		case 0:
			g.dispatch(f, resuming)
		case 1:
			write(map[string]any{"op": 1, "d": g.seqOrNil()})
		case 7: // reconnect: resume on a new connection
			return errors.New("gateway asked to reconnect")
		case 9: // invalid session; d says whether it can be resumed
			var resumable bool
			json.Unmarshal(f.D, &resumable)
			if !resumable {
				g.lose("the gateway invalidated the session")
			}
			return errors.New("invalid session")
		case 11:
			select {
			case acked <- struct{}{}:
			default:
			}
		default:
			g.log.Debug("gateway: unknown op", "op", f.Op)
		}
	}
}

// Reconnect drops the current connection (as a zombie: no close frame, so
// the session stays resumable): Run resumes at the session's resume URL,
// or identifies anew when that fails. It is for a connection that
// acknowledges heartbeats but has stopped delivering events.
func (g *Gateway) Reconnect(reason string) bool {
	c := g.conn.Load()
	if c == nil {
		return false
	}
	g.log.Warn("gateway: dropping the connection to resume", "reason", reason)
	c.Close()
	return true
}

func (g *Gateway) seqOrNil() any {
	if n := g.seq.Load(); n != 0 {
		return n
	}
	return nil
}

// lose forgets the session: the next connection identifies, and a gap is
// recorded since events between may never arrive.
func (g *Gateway) lose(reason string) {
	if g.sessionID != "" {
		g.ev.Gap(reason + "; messages sent meanwhile may be missing (resume was not possible)")
	}
	g.sessionID, g.resumeURL = "", ""
	g.seq.Store(0)
}

func (g *Gateway) identify(write func(any) error) error {
	return write(map[string]any{"op": 2, "d": map[string]any{
		"token": g.token, "intents": Intents,
		"properties": map[string]string{"os": "linux", "browser": "klbr-discord", "device": "klbr-discord"},
	}})
}

func (g *Gateway) dispatch(f frame, resuming bool) {
	switch f.T {
	case "READY":
		var r struct {
			SessionID string `json:"session_id"`
			ResumeURL string `json:"resume_gateway_url"`
			User      struct {
				ID string `json:"id"`
			} `json:"user"`
			Guilds []struct {
				ID string `json:"id"`
			} `json:"guilds"`
		}
		if err := json.Unmarshal(f.D, &r); err != nil || r.SessionID == "" {
			g.log.Warn("gateway: malformed READY")
			return
		}
		g.sessionID, g.resumeURL = r.SessionID, strings.TrimSpace(r.ResumeURL)
		var guilds []string
		for _, gd := range r.Guilds {
			if snowflake(gd.ID) && len(guilds) < maxReadyGuilds {
				guilds = append(guilds, gd.ID)
			}
		}
		g.ev.Ready(r.User.ID, guilds)
		g.ev.State(true, false)
	case "RESUMED":
		g.ev.State(true, true)
	case "MESSAGE_CREATE":
		g.ev.Message(f.D)
	case "THREAD_CREATE":
		if th, err := ParseThreadCreate(f.D); err == nil {
			g.ev.Thread(th)
		} else {
			g.log.Warn("gateway: THREAD_CREATE refused", "error", err)
		}
	case "INTERACTION_CREATE":
		if ix, err := ParseInteraction(f.D); err == nil {
			if g.ev.Interaction != nil {
				g.ev.Interaction(ix)
			}
		} else {
			g.log.Warn("gateway: INTERACTION_CREATE refused", "error", err)
		}
	default:
		// Event types this transport does not use are ignored.
	}
}
