package httpguard

import (
	"container/list"
	"context"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Gate keeps a TCP listener answering the clients that present a credential while
// others hold every connection they can open. Nothing can tell a stranger from the
// operator before a request's headers are read, so every connection starts a stranger,
// and strangers are kept cheap and few:
//   - at most Limits.Strangers strangers are open (DefaultStrangers, fewer when the
//     open-file limit is low), more than a flood of thousands needs to be served at once;
//   - a new connection over that bound closes the oldest stranger (a slowloris that
//     holds partial headers is the oldest; an operator's browser sends its headers at
//     once), but never one younger than StrangerGrace: Accept waits instead, so that no
//     rate of new connections can close the operator's before its first request is read;
//   - a stranger lives Limits.Stranger at most (DefaultStrangerLife), whatever it does,
//     and at least half of that (spread so that a crowd does not end all at once);
//   - a stranger's request is answered with "Connection: close" (Gate.Handler).
//
// A request whose credential the handler has checked calls Trust: its connection stops
// being a stranger and takes one of Limits.Conns() places kept for trusted connections,
// which live by the server's own idle timeout. Open descriptors are thus at most
// Strangers + Conns() however many connections arrive.
type Gate struct {
	strangers, trusted int
	life, grace        time.Duration

	mu       sync.Mutex
	waiting  list.List // *gateConn strangers, oldest first
	nTrusted int

	evicted atomic.Int64 // strangers closed for a newer connection
	expired atomic.Int64 // strangers closed at the end of their life
}

// Bounds of a Gate.
const (
	// DefaultStrangers is the strangers' bound when Limits.Strangers is 0, lowered to a
	// quarter of the open-file limit if that is less.
	DefaultStrangers    = 4096
	DefaultStrangerLife = 5 * time.Second
	// StrangerGrace is how long a new connection is sure to be kept to present its
	// credential.
	StrangerGrace = time.Second
)

// NewGate returns a gate with l's bounds (Strangers, Stranger, MaxConns).
func NewGate(l Limits) *Gate {
	g := &Gate{strangers: l.Strangers, trusted: l.Conns(), life: l.Stranger, grace: StrangerGrace}
	if g.strangers <= 0 {
		g.strangers = defaultStrangers()
	}
	if g.life <= 0 {
		g.life = DefaultStrangerLife
	}
	g.grace = min(g.grace, g.life)
	return g
}

// defaultStrangers is DefaultStrangers, or a quarter of the open-file limit if less: the
// strangers' descriptors never take most of what the process may open.
func defaultStrangers() int {
	var rl syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl) != nil || rl.Cur/4 >= DefaultStrangers {
		return DefaultStrangers
	}
	return max(16, int(rl.Cur/4))
}

// GateStats counts what a gate did.
type GateStats struct {
	Strangers int   // strangers open now
	Trusted   int   // trusted connections open now
	Evicted   int64 // strangers closed to make room for a newer connection
	Expired   int64 // strangers closed when their life ended
}

// Stats reports the gate's counts.
func (g *Gate) Stats() GateStats {
	g.mu.Lock()
	defer g.mu.Unlock()
	return GateStats{Strangers: g.waiting.Len(), Trusted: g.nTrusted, Evicted: g.evicted.Load(), Expired: g.expired.Load()}
}

// Listener wraps l: its connections pass the gate.
func (g *Gate) Listener(l net.Listener) net.Listener {
	return &gateListener{Listener: l, g: g, done: make(chan struct{})}
}

// Serve prepares srv for the gate: each request's context knows its connection, so that
// Trust and Handler can find it. srv must serve a Listener of this gate.
func (g *Gate) Serve(srv *http.Server) *http.Server {
	prev := srv.ConnContext
	srv.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
		if prev != nil {
			ctx = prev(ctx, c)
		}
		if gc, ok := c.(*gateConn); ok {
			ctx = context.WithValue(ctx, gateKey{}, gc)
		}
		return ctx
	}
	return srv
}

// Handler answers a stranger's requests with "Connection: close": a connection that has
// not presented a credential is not kept alive for another request.
func (g *Gate) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if gc := connOf(r); gc != nil && !gc.g.isTrusted(gc) {
			w.Header().Set("Connection", "close")
		}
		next.ServeHTTP(w, r)
	})
}

// Trust marks the connection of r, whose credential the caller has checked, as trusted:
// it is no longer closed for newer connections or at the end of a stranger's life, and
// may be kept alive. It reports false when the places for trusted connections are all
// taken (the caller answers 503; the connection closes after the answer). A request
// that did not come through a gate is always trusted.
func Trust(w http.ResponseWriter, r *http.Request) bool {
	gc := connOf(r)
	if gc == nil {
		return true
	}
	if !gc.g.trust(gc) {
		return false
	}
	if w.Header().Get("Connection") == "close" {
		w.Header().Del("Connection")
	}
	return true
}

type gateKey struct{}

func connOf(r *http.Request) *gateConn {
	gc, _ := r.Context().Value(gateKey{}).(*gateConn)
	return gc
}

type gateListener struct {
	net.Listener
	g         *Gate
	closeOnce sync.Once
	done      chan struct{} // closed by Close: a waiting Accept returns
}

func (l *gateListener) Accept() (net.Conn, error) {
	if !l.g.room(l.done) {
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return l.g.admit(c), nil
}

func (l *gateListener) Close() error {
	err := l.Listener.Close()
	l.closeOnce.Do(func() { close(l.done) })
	return err
}

// room waits until a new stranger may come in: there is room, or the oldest stranger has
// had its grace. It reports false if done closed first.
func (g *Gate) room(done <-chan struct{}) bool {
	for {
		g.mu.Lock()
		wait := time.Duration(0)
		if g.waiting.Len() >= g.strangers {
			wait = g.grace - time.Since(g.waiting.Front().Value.(*gateConn).born)
		}
		g.mu.Unlock()
		if wait <= 0 {
			return true
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-done:
			t.Stop()
			return false
		}
	}
}

// connState is where a gateConn stands.
type connState int

const (
	stateStranger connState = iota
	stateTrusted
	stateGone // closed, evicted or expired
)

type gateConn struct {
	net.Conn
	g     *Gate
	state connState     // guarded by g.mu
	elem  *list.Element // in g.waiting while a stranger
	born  time.Time
	timer *time.Timer
}

// admit lets c in as the newest stranger, closing the oldest if the strangers are at
// their bound.
func (g *Gate) admit(c net.Conn) net.Conn {
	gc := &gateConn{Conn: c, g: g, born: time.Now()}
	g.mu.Lock()
	var oldest *gateConn
	if g.waiting.Len() >= g.strangers {
		oldest = g.waiting.Remove(g.waiting.Front()).(*gateConn)
		oldest.state, oldest.elem = stateGone, nil
	}
	gc.elem = g.waiting.PushBack(gc)
	gc.timer = time.AfterFunc(g.lifeOf(), gc.expire)
	g.mu.Unlock()
	if oldest != nil {
		g.evicted.Add(1)
		oldest.timer.Stop()
		oldest.Conn.Close()
	}
	return gc
}

// lifeOf is a new stranger's life: between half of the gate's life and all of it, so that
// strangers that came in together do not all end, and come back, together (a burst the
// operator's connection would wait behind in the kernel's queue).
func (g *Gate) lifeOf() time.Duration {
	return g.life/2 + rand.N(g.life/2+1)
}

func (g *Gate) isTrusted(gc *gateConn) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return gc.state == stateTrusted
}

func (g *Gate) trust(gc *gateConn) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch gc.state {
	case stateTrusted:
		return true
	case stateStranger:
		if g.nTrusted >= g.trusted {
			return false
		}
		g.waiting.Remove(gc.elem)
		gc.elem, gc.state = nil, stateTrusted
		g.nTrusted++
		gc.timer.Stop()
		return true
	}
	return false
}

// expire closes a connection still a stranger at the end of its life.
func (gc *gateConn) expire() {
	g := gc.g
	g.mu.Lock()
	if gc.state != stateStranger {
		g.mu.Unlock()
		return
	}
	g.waiting.Remove(gc.elem)
	gc.elem, gc.state = nil, stateGone
	g.mu.Unlock()
	g.expired.Add(1)
	gc.Conn.Close()
}

func (gc *gateConn) Close() error {
	g := gc.g
	g.mu.Lock()
	switch gc.state {
	case stateStranger:
		g.waiting.Remove(gc.elem)
		gc.elem = nil
	case stateTrusted:
		g.nTrusted--
	}
	gc.state = stateGone
	g.mu.Unlock()
	gc.timer.Stop()
	return gc.Conn.Close()
}

// Unwrap returns the connection underneath.
func (gc *gateConn) Unwrap() net.Conn { return gc.Conn }
