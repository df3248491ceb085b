// Package resume is a byte stream that outlives its connections: each side numbers the
// bytes it sends, keeps those the peer has not acknowledged (a bounded window), and on each
// new connection both sides say how much they have received, so that the sender replays
// exactly the rest. Nothing is lost and nothing is doubled across a drop; a gap that cannot
// be replayed (the far end restarted, or lost what it acknowledged) ends the stream with
// ErrGap or ErrOtherStream, never with silently wrong bytes.
//
// One side listens (klbr-kernel --listen on a worker host, which draws the stream's ID), the
// other dials (klbr-core, over its SSH connection). Either calls Attach with each new
// connection; Read, Write and CloseWrite work across them, blocking while no connection is
// attached.
//
// A dialer that lost the stream's state (klbr-core restarted while a worker on a host ran on)
// cannot resume it: it asks for a new epoch instead (Config.NewEpoch). The listener, when no
// connection is attached, drops what it had in flight both ways (bytes sent and not
// acknowledged, bytes received and not read), takes the epoch's ID and begins again at zero;
// its Read and Write report the cut once (ErrNewEpoch), so the layer above can find its next
// message boundary. The new dialer never sees a byte of the old epoch.
package resume

import (
	"bufio"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// Errors.
var (
	// ErrGap: the peer's count of bytes received is outside what this side can replay.
	ErrGap = errors.New("resume: the peer's position cannot be replayed")
	// ErrOtherStream: the far end is another stream than the one this side was attached to
	// (it restarted): its state is gone.
	ErrOtherStream = errors.New("resume: the far end is another stream (it restarted)")
	// ErrClosed: the stream was closed here.
	ErrClosed = errors.New("resume: stream closed")
	// ErrReplaced: a newer connection took this one's place.
	ErrReplaced = errors.New("resume: connection replaced by a newer one")
	// ErrStranger: a listener refused a dialer that is new to it while the stream has
	// history: it is not the stream's peer.
	ErrStranger = errors.New("resume: a new peer for a stream with history")
	// ErrAttached: a listener refused a new epoch while a connection is attached; the dialer
	// asks again (the attached one may be a dead peer's, not yet timed out).
	ErrAttached = errors.New("resume: a new epoch was asked for while a connection is attached")
	// ErrNewEpoch (a listener's Read and Write): a new epoch began; what was in flight of the
	// old one is gone. Read reports it once, before the first byte of the new epoch; a Write
	// it cuts wrote nothing into the new epoch.
	ErrNewEpoch = errors.New("resume: a new epoch began; what was in flight is gone")
)

// Config configures a stream.
type Config struct {
	// Listener: this side draws the ID; the other learns it.
	Listener bool
	// NewEpoch (a dialer): this side has none of the stream's state (it restarted) and asks
	// the listener to begin a new epoch, of an ID this side draws, dropping what was in
	// flight; it never resumes the old one.
	NewEpoch bool
	// Window bounds both the bytes sent and not acknowledged (Write blocks beyond it) and
	// the bytes received and not read (the connection is not read beyond it); 0: 1 MiB.
	Window int
	// Handshake bounds the exchange of hellos on a new connection; 0: 10 s.
	Handshake time.Duration
	// Keepalive: each side sends at least this often (an ack, when it has nothing else),
	// and drops a connection that has been silent for three times as long, so that a link
	// that went down unnoticed by the transport counts as detached; 0: 5 s.
	Keepalive time.Duration
}

// Stream is one resumable stream.
type Stream struct {
	window    int
	handshake time.Duration
	keepalive time.Duration
	listener  bool

	mu   sync.Mutex
	cond *sync.Cond
	id   ID
	// known: the dialer has learnt the ID.
	known bool
	// epochAsk: a NewEpoch dialer's hellos ask for the epoch id until the listener is seen
	// to have taken it.
	epochAsk bool
	// epochs counts the epochs a listener began; readEpoch is the last Read reported.
	epochs, readEpoch uint64

	out     []byte // positions [acked, sent) (the end, at sent, has no byte)
	acked   uint64 // the peer has received everything below
	sent    uint64 // bytes written
	closing bool   // CloseWrite: the end is at position sent

	in       []byte // received, not yet read
	recv     uint64 // positions received: bytes, and the end
	inEnd    bool
	ackWrote uint64 // the last count written in an ack (current connection)
	ping     bool   // the writer owes a keepalive
	ackDue   bool   // an ack of what arrived is due even without data to carry it
	ackTimer bool   // a timer will set ackDue

	err      error // the stream is over
	conn     io.Closer
	gen      uint64 // bumped at every attach and detach
	detached time.Time

	readBy, writeBy time.Time   // Read's and Write's deadlines (zero: none)
	alarm           *time.Timer // wakes the waiters at alarmAt, for the deadlines
	alarmAt         time.Time
}

// New makes a stream.
func New(cfg Config) *Stream {
	s := &Stream{window: cfg.Window, handshake: cfg.Handshake, keepalive: cfg.Keepalive, listener: cfg.Listener, detached: time.Now()}
	if s.keepalive <= 0 {
		s.keepalive = 5 * time.Second
	}
	if s.window <= 0 {
		s.window = 1 << 20
	}
	if s.handshake <= 0 {
		s.handshake = 10 * time.Second
	}
	if s.listener {
		_, _ = rand.Read(s.id[:])
		s.known = true
	} else if cfg.NewEpoch {
		_, _ = rand.Read(s.id[:])
		s.epochAsk = true
	}
	s.cond = sync.NewCond(&s.mu)
	return s
}

// ID is the stream's ID (zero on a dialer before its first connection).
func (s *Stream) ID() ID {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.id
}

// Write queues p; it blocks while the window is full, also while no connection is attached.
// A new epoch that begins meanwhile ends it with ErrNewEpoch: nothing of p is in the new one.
func (s *Stream) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	ep := s.epochs
	for len(p) > 0 {
		for s.err == nil && !s.closing && s.epochs == ep && len(s.out) >= s.window && !s.passed(s.writeBy) {
			s.cond.Wait()
		}
		if s.err != nil {
			return n, s.err
		}
		if s.epochs != ep {
			return n, ErrNewEpoch
		}
		if len(s.out) >= s.window && !s.closing {
			return n, os.ErrDeadlineExceeded
		}
		if s.closing {
			return n, ErrClosed
		}
		k := min(len(p), s.window-len(s.out))
		s.out = append(s.out, p[:k]...)
		s.sent += uint64(k)
		p, n = p[k:], n+k
		s.cond.Broadcast()
	}
	return n, nil
}

// Read reads what arrived; io.EOF after the peer's end; ErrNewEpoch once when a new epoch
// began since the last Read.
func (s *Stream) Read(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(s.in) == 0 && !s.inEnd && s.err == nil && s.readEpoch == s.epochs && !s.passed(s.readBy) {
		s.cond.Wait()
	}
	if s.readEpoch != s.epochs {
		s.readEpoch = s.epochs
		return 0, ErrNewEpoch
	}
	if len(s.in) > 0 {
		n := copy(p, s.in)
		s.in = s.in[n:]
		if len(s.in) == 0 {
			s.in = nil
		}
		s.cond.Broadcast()
		return n, nil
	}
	if s.inEnd {
		return 0, io.EOF
	}
	if s.err == nil {
		return 0, os.ErrDeadlineExceeded
	}
	return 0, s.err
}

// SetReadDeadline makes a Read that has nothing to return by t fail with
// os.ErrDeadlineExceeded (a net.Error whose Timeout is true); zero: no
// deadline. It applies to a Read already waiting too.
func (s *Stream) SetReadDeadline(t time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.readBy = t
	s.cond.Broadcast()
	return nil
}

// SetWriteDeadline makes a Write that is still blocked (the window full)
// at t fail with os.ErrDeadlineExceeded, having written part of its bytes
// (it says how many); zero: no deadline.
func (s *Stream) SetWriteDeadline(t time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.writeBy = t
	s.cond.Broadcast()
	return nil
}

// passed reports whether deadline t has passed; when it has not, the
// waiters are woken at t to look again. s.mu is held.
func (s *Stream) passed(t time.Time) bool {
	if t.IsZero() {
		return false
	}
	d := time.Until(t)
	if d <= 0 {
		return true
	}
	if s.alarmAt.IsZero() || t.Before(s.alarmAt) {
		s.alarmAt = t
		if s.alarm == nil {
			s.alarm = time.AfterFunc(d, s.ring)
		} else {
			s.alarm.Reset(d)
		}
	}
	return false
}

// ring wakes every waiter (a deadline may have passed).
func (s *Stream) ring() {
	s.mu.Lock()
	s.alarmAt = time.Time{}
	s.cond.Broadcast()
	s.mu.Unlock()
}

// CloseWrite ends what this side sends: the peer reads io.EOF after the last byte.
func (s *Stream) CloseWrite() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closing = true
	s.cond.Broadcast()
	return nil
}

// Flushed reports whether the peer has received everything sent and the end.
func (s *Stream) Flushed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closing && s.acked == s.sent+1
}

// WaitFlushed waits until Flushed, the stream fails, or d passes.
func (s *Stream) WaitFlushed(d time.Duration) bool {
	t := time.AfterFunc(d, func() {
		s.mu.Lock()
		s.cond.Broadcast()
		s.mu.Unlock()
	})
	defer t.Stop()
	end := time.Now().Add(d)
	s.mu.Lock()
	defer s.mu.Unlock()
	for !(s.closing && s.acked == s.sent+1) && s.err == nil && time.Now().Before(end) {
		s.cond.Wait()
	}
	return s.closing && s.acked == s.sent+1
}

// Detached says since when no connection has been attached (ok false: one is).
func (s *Stream) Detached() (since time.Time, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.detached, s.conn == nil
}

// Err is why the stream ended (nil: it has not).
func (s *Stream) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// Close ends the stream here: the attached connection is closed (after the acks this side
// owes are written, for at most a second) and every call returns ErrClosed.
func (s *Stream) Close() error {
	s.Abort(ErrClosed)
	return nil
}

// Abort ends the stream with err.
func (s *Stream) Abort(err error) {
	t := time.AfterFunc(time.Second, func() {
		s.mu.Lock()
		s.cond.Broadcast()
		s.mu.Unlock()
	})
	defer t.Stop()
	end := time.Now().Add(time.Second)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ackDue = true
	s.cond.Broadcast()
	for s.conn != nil && s.err == nil && s.ackWrote < s.recv && time.Now().Before(end) {
		s.cond.Wait()
	}
	if s.err == nil {
		s.err = err
	}
	if s.conn != nil {
		s.conn.Close()
		s.conn = nil
	}
	s.gen++
	s.cond.Broadcast()
}

// Attach carries the stream over c until c fails, a newer connection replaces it, or the
// stream ends; c is closed when Attach returns. A newer Attach replaces an older one. The
// error says why c ended; the stream goes on (Err is nil) unless it was fatal (ErrGap,
// ErrOtherStream, or the stream was closed).
func (s *Stream) Attach(c io.ReadWriteCloser) error {
	s.mu.Lock()
	if s.err != nil {
		s.mu.Unlock()
		c.Close()
		return s.err
	}
	// A dialer's new connection displaces the old one at once. A listener's
	// displaces it only once its hello names this stream: a stranger (a
	// cell of the worker connecting to its own socket, say) never cuts the
	// peer's connection.
	if !s.listener {
		if s.conn != nil {
			s.conn.Close()
			s.conn = nil
			s.detached = time.Now()
		}
		s.gen++
	}
	gen := s.gen
	mine := hello{id: s.id, recv: s.recv, epoch: s.epochAsk}
	s.mu.Unlock()

	peer, err := s.shake(c, mine)
	if err != nil {
		c.Close()
		return fmt.Errorf("resume: handshake: %w", err)
	}
	s.mu.Lock()
	if s.listener && s.err == nil {
		if peer.epoch && peer.id != s.id {
			// A new epoch, never while a connection is attached: one
			// peer at a time, and a dead one's connection times out.
			err := ErrAttached
			if peer.id == (ID{}) {
				err = fmt.Errorf("%w: a new epoch without an ID", errProtocol)
			}
			if s.conn == nil && peer.id != (ID{}) {
				s.begin(peer.id)
				err = nil
			}
			if err != nil {
				s.mu.Unlock()
				c.Close()
				return err
			}
		} else if err := s.checkStranger(peer); err != nil {
			s.mu.Unlock()
			c.Close()
			return err
		}
		if s.conn != nil {
			s.conn.Close()
			s.conn = nil
		}
		s.gen++
		gen = s.gen
	}
	if err := s.admit(gen, &peer, c); err != nil {
		s.mu.Unlock()
		c.Close()
		return err
	}
	s.mu.Unlock()

	wrote := make(chan struct{})
	go func() {
		defer close(wrote)
		s.writeLoop(c, gen, peer.recv, mine.recv)
	}()
	var heard atomic.Int64
	heard.Store(time.Now().UnixNano())
	quiet := make(chan struct{})
	go s.watch(c, gen, &heard, quiet)
	err = s.readLoop(c, gen, &heard)
	close(quiet)
	s.mu.Lock()
	if s.gen == gen {
		s.conn = nil
		s.gen++
		s.detached = time.Now()
	}
	s.cond.Broadcast()
	s.mu.Unlock()
	c.Close()
	<-wrote
	return err
}

// shake exchanges hellos within the handshake bound.
func (s *Stream) shake(c io.ReadWriteCloser, mine hello) (hello, error) {
	sent := make(chan error, 1)
	go func() {
		_, err := c.Write(mine.encode())
		sent <- err
	}()
	t := time.AfterFunc(s.handshake, func() { c.Close() })
	defer t.Stop()
	peer, err := readHello(c)
	if err != nil {
		c.Close()
		<-sent
		return hello{}, err
	}
	if err := <-sent; err != nil {
		return hello{}, err
	}
	return peer, nil
}

// admit makes c the stream's connection after its hello; s.mu is held.
func (s *Stream) admit(gen uint64, peer *hello, c io.Closer) error {
	if s.err != nil {
		return s.err
	}
	if s.gen != gen {
		return ErrReplaced
	}
	end := s.sent
	if s.closing {
		end++
	}
	if s.listener {
		if err := s.checkStranger(*peer); err != nil {
			return err
		}
	} else {
		switch {
		case peer.epoch:
			return fmt.Errorf("%w: a listener asked for a new epoch", errProtocol)
		case s.epochAsk && peer.id != s.id:
			// The listener begins this side's epoch at this hello (or
			// refuses the connection): from nothing, whatever its hello says.
			if s.recv > 0 {
				s.fail(fmt.Errorf("%w: epoch %s was taken, now %s", ErrOtherStream, s.id, peer.id))
				return s.err
			}
			peer.recv = 0
		case s.known && peer.id != s.id:
			s.fail(fmt.Errorf("%w: was %s, now %s", ErrOtherStream, s.id, peer.id))
			return s.err
		default:
			s.id, s.known, s.epochAsk = peer.id, true, false
		}
	}
	if peer.recv < s.acked || peer.recv > end {
		s.fail(fmt.Errorf("%w: it has received %d, this side keeps %d to %d", ErrGap, peer.recv, s.acked, end))
		return s.err
	}
	s.ack(peer.recv)
	s.conn = c
	s.ackWrote = s.recv
	s.cond.Broadcast()
	return nil
}

// begin starts a listener's new epoch id: what was in flight both ways is dropped and
// both counts begin at zero; s.mu is held.
func (s *Stream) begin(id ID) {
	s.id = id
	s.out, s.acked, s.sent = nil, 0, 0
	s.in, s.recv, s.inEnd = nil, 0, false
	s.ackWrote, s.ackDue, s.ping = 0, false, false
	s.epochs++
	s.cond.Broadcast()
}

// checkStranger refuses, on a listener, a peer that is not this stream's:
// one that knows another stream, or a new one once the stream has history.
func (s *Stream) checkStranger(peer hello) error {
	if peer.id != s.id && peer.id != (ID{}) {
		return fmt.Errorf("%w: it knows stream %s, this is %s", ErrStranger, peer.id, s.id)
	}
	if peer.id == (ID{}) && (s.recv > 0 || s.acked > 0) {
		return ErrStranger
	}
	return nil
}

// ack drops what the peer has received; s.mu is held.
func (s *Stream) ack(n uint64) {
	if n <= s.acked {
		return
	}
	drop := min(n, s.sent) - min(s.acked, s.sent)
	s.out = s.out[drop:]
	if len(s.out) == 0 {
		s.out = nil
	}
	s.acked = n
	s.cond.Broadcast()
}

// fail ends the stream; s.mu is held.
func (s *Stream) fail(err error) {
	if s.err == nil {
		s.err = err
	}
	if s.conn != nil {
		s.conn.Close()
		s.conn = nil
	}
	s.gen++
	s.cond.Broadcast()
}

// watch pokes the writer every keepalive (it sends an ack when it has nothing else) and
// closes c once nothing was heard for three keepalives.
func (s *Stream) watch(c io.Closer, gen uint64, heard *atomic.Int64, quiet <-chan struct{}) {
	t := time.NewTicker(s.keepalive)
	defer t.Stop()
	for {
		select {
		case <-quiet:
			return
		case <-t.C:
		}
		if time.Since(time.Unix(0, heard.Load())) > 3*s.keepalive {
			c.Close()
			return
		}
		s.mu.Lock()
		if s.gen == gen {
			s.ping = true
			s.cond.Broadcast()
		}
		s.mu.Unlock()
	}
}

func (s *Stream) readLoop(c io.Reader, gen uint64, heard *atomic.Int64) error {
	br := bufio.NewReaderSize(c, 64<<10)
	buf := make([]byte, MaxFrame)
	for {
		f, err := readFrame(br, buf)
		if err != nil {
			return err
		}
		heard.Store(time.Now().UnixNano())
		s.mu.Lock()
		if s.gen != gen {
			err := s.err
			s.mu.Unlock()
			if err != nil {
				return err
			}
			return ErrReplaced
		}
		err = s.take(gen, f)
		s.mu.Unlock()
		if err != nil {
			return err
		}
	}
}

// take applies one frame; s.mu is held.
func (s *Stream) take(gen uint64, f frame) error {
	if s.epochAsk {
		// A listener sends frames only on a connection it admitted: it
		// has taken this side's epoch.
		s.known, s.epochAsk = true, false
	}
	switch f.kind {
	case frameAck:
		end := s.sent
		if s.closing {
			end++
		}
		if f.n > end {
			return fmt.Errorf("%w: ack of %d, only %d sent", errProtocol, f.n, end)
		}
		s.ack(f.n)
	case frameData:
		if s.inEnd || f.n > s.recv {
			return fmt.Errorf("%w: data at %d, expected %d", errProtocol, f.n, s.recv)
		}
		// A replay from a count this side sent before the old connection
		// delivered more: skip what arrived already.
		if skip := s.recv - f.n; skip > 0 {
			if skip >= uint64(len(f.data)) {
				return nil
			}
			f.data = f.data[skip:]
		}
		for len(s.in)+len(f.data) > s.window && len(s.in) > 0 && s.gen == gen && s.err == nil {
			s.cond.Wait()
		}
		if s.gen != gen || s.err != nil {
			return ErrReplaced
		}
		s.in = append(s.in, f.data...)
		s.recv += uint64(len(f.data))
		s.delayAck()
	case frameFin:
		if s.inEnd && f.n+1 == s.recv {
			return nil // a replay of the end
		}
		if s.inEnd || f.n != s.recv {
			return fmt.Errorf("%w: end at %d, expected %d", errProtocol, f.n, s.recv)
		}
		s.inEnd = true
		s.recv++
		s.ackDue = true
	}
	s.cond.Broadcast()
	return nil
}

// ackDelay is how long an ack may wait for data to ride on: a request's answer
// usually follows within it, and carries the ack in the same write.
const ackDelay = 5 * time.Millisecond

// delayAck makes an ack due after ackDelay, or now once a quarter of the window is
// unacknowledged; s.mu is held.
func (s *Stream) delayAck() {
	if s.recv-s.ackWrote >= uint64(s.window/4) {
		s.ackDue = true
		return
	}
	if s.ackTimer {
		return
	}
	s.ackTimer = true
	time.AfterFunc(ackDelay, func() {
		s.mu.Lock()
		s.ackTimer, s.ackDue = false, true
		s.cond.Broadcast()
		s.mu.Unlock()
	})
}

// writeLoop sends, from position from, what this side has and the peer has not, and acks
// of what arrives, until the connection is detached.
func (s *Stream) writeLoop(c io.WriteCloser, gen, from, acked uint64) {
	pos := from
	buf := make([]byte, 0, MaxFrame+32)
	for {
		s.mu.Lock()
		for s.gen == gen && s.err == nil && !(pos < s.sent || (s.closing && pos == s.sent) || (s.recv > acked && s.ackDue) || s.ping) {
			s.cond.Wait()
		}
		if s.gen != gen || s.err != nil {
			s.mu.Unlock()
			return
		}
		buf = buf[:0]
		ackTo := acked
		if s.recv > acked || s.ping {
			s.ping, s.ackDue = false, false
			buf = appendCount(buf, frameAck, s.recv)
			ackTo = s.recv
		}
		pos = max(pos, s.acked)
		if pos < s.sent {
			start := pos - s.acked
			n := min(s.sent-pos, MaxFrame)
			buf = appendData(buf, pos, s.out[start:start+n])
			pos += n
		} else if s.closing && pos == s.sent {
			buf = appendCount(buf, frameFin, s.sent)
			pos++
		}
		s.mu.Unlock()
		if _, err := c.Write(buf); err != nil {
			c.Close()
			return
		}
		acked = ackTo
		s.mu.Lock()
		if s.gen == gen {
			s.ackWrote = ackTo
			s.cond.Broadcast()
		}
		s.mu.Unlock()
	}
}
