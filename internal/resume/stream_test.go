package resume

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// sockets makes connected pairs of real Unix sockets.
type sockets struct {
	t *testing.T
	l net.Listener
}

func newSockets(t *testing.T) *sockets {
	l, err := net.Listen("unix", filepath.Join(t.TempDir(), "s"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return &sockets{t: t, l: l}
}

func (s *sockets) pair() (net.Conn, net.Conn) {
	acc := make(chan net.Conn, 1)
	go func() {
		c, err := s.l.Accept()
		if err != nil {
			acc <- nil
			return
		}
		acc <- c
	}()
	d, err := net.Dial("unix", s.l.Addr().String())
	if err != nil {
		s.t.Fatal(err)
	}
	a := <-acc
	if a == nil {
		s.t.Fatal("accept failed")
	}
	return a, d
}

// cut closes its connection once limit bytes have been written through it, after writing
// the part of the last write that fits: a drop at that byte offset.
type cut struct {
	net.Conn
	mu    sync.Mutex
	limit int
}

func (c *cut) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.limit <= 0 {
		c.Conn.Close()
		return 0, net.ErrClosed
	}
	if len(p) > c.limit {
		n, _ := c.Conn.Write(p[:c.limit])
		c.limit = 0
		c.Conn.Close()
		return n, net.ErrClosed
	}
	c.limit -= len(p)
	return c.Conn.Write(p)
}

func randomBytes(r *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// writeChunks writes data in random chunks, then ends the stream.
func writeChunks(t *testing.T, s *Stream, r *rand.Rand, data []byte) {
	for len(data) > 0 {
		k := min(len(data), 1+r.IntN(100<<10))
		if _, err := s.Write(data[:k]); err != nil {
			t.Errorf("write: %v", err)
			return
		}
		data = data[k:]
	}
	s.CloseWrite()
}

// TestCutsAtRandomOffsets carries megabytes each way over connections that are cut at
// random byte offsets in either direction: what each side reads is exactly what the other
// wrote, nothing lost, nothing doubled.
func TestCutsAtRandomOffsets(t *testing.T) {
	for seed := range uint64(8) {
		r := rand.New(rand.NewPCG(seed, 42))
		socks := newSockets(t)
		srv := New(Config{Listener: true, Window: 64 << 10})
		cli := New(Config{Window: 48 << 10})
		up := randomBytes(r, 3<<20+r.IntN(1000))
		down := randomBytes(r, 2<<20+r.IntN(1000))

		var got [2][]byte
		var wg sync.WaitGroup
		wg.Add(4)
		go func() { defer wg.Done(); writeChunks(t, cli, rand.New(rand.NewPCG(seed, 1)), up) }()
		go func() { defer wg.Done(); writeChunks(t, srv, rand.New(rand.NewPCG(seed, 2)), down) }()
		go func() { defer wg.Done(); got[0], _ = io.ReadAll(srv) }()
		go func() { defer wg.Done(); got[1], _ = io.ReadAll(cli) }()

		var stop atomic.Bool
		drops := 0
		linked := make(chan struct{})
		go func() {
			defer close(linked)
			for !stop.Load() {
				a, b := socks.pair()
				// Offsets from 0 (before the hello) to past a window.
				ca := &cut{Conn: a, limit: r.IntN(200 << 10)}
				cb := &cut{Conn: b, limit: r.IntN(200 << 10)}
				done := make(chan struct{})
				go func() { srv.Attach(ca); close(done) }()
				cli.Attach(cb)
				<-done
				drops++
				if drops > 20000 {
					// A stream that never completes: fail, not hang.
					t.Errorf("seed %d: no progress after %d connections", seed, drops)
					srv.Abort(errors.New("test: no progress"))
					cli.Abort(errors.New("test: no progress"))
					return
				}
			}
		}()
		wg.Wait()
		for !(srv.Flushed() && cli.Flushed()) && srv.Err() == nil {
			time.Sleep(time.Millisecond)
		}
		stop.Store(true)
		srv.Close()
		cli.Close()
		<-linked
		if !bytes.Equal(got[0], up) {
			t.Fatalf("seed %d: the listener read %d bytes, the dialer wrote %d (or they differ)", seed, len(got[0]), len(up))
		}
		if !bytes.Equal(got[1], down) {
			t.Fatalf("seed %d: the dialer read %d bytes, the listener wrote %d (or they differ)", seed, len(got[1]), len(down))
		}
		if drops < 10 {
			t.Fatalf("seed %d: only %d connections: the test did not cut", seed, drops)
		}
		t.Logf("seed %d: %d connections", seed, drops)
	}
}

// attach attaches a and b to a fresh pair of sockets; it returns when both connections
// have ended, with their errors.
func attach(socks *sockets, srv, cli *Stream, stop <-chan struct{}) (errSrv, errCli error) {
	a, b := socks.pair()
	done := make(chan error, 1)
	go func() { done <- srv.Attach(a) }()
	go func() {
		<-stop
		a.Close()
		b.Close()
	}()
	errCli = cli.Attach(b)
	a.Close()
	return <-done, errCli
}

func TestOneConnection(t *testing.T) {
	socks := newSockets(t)
	srv := New(Config{Listener: true})
	cli := New(Config{})
	stop := make(chan struct{})
	res := make(chan error, 1)
	go func() { _, err := attach(socks, srv, cli, stop); res <- err }()
	if _, err := cli.Write([]byte("x = 1\n")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 16)
	n, err := srv.Read(buf)
	if err != nil || string(buf[:n]) != "x = 1\n" {
		t.Fatalf("read %q, %v", buf[:n], err)
	}
	if cli.ID() != srv.ID() {
		t.Fatalf("the dialer learnt %s, the listener is %s", cli.ID(), srv.ID())
	}
	close(stop)
	<-res
	if _, ok := srv.Detached(); !ok {
		t.Fatal("the listener says a connection is attached after it ended")
	}
	if srv.Err() != nil || cli.Err() != nil {
		t.Fatalf("a dropped connection ended the stream: %v, %v", srv.Err(), cli.Err())
	}
}

// TestRestartedFarEnd: a dialer that reaches a new listener (the kernel restarted, its
// state gone) ends its stream with ErrOtherStream rather than go on with a new peer.
func TestRestartedFarEnd(t *testing.T) {
	socks := newSockets(t)
	srv := New(Config{Listener: true})
	cli := New(Config{})
	stop := make(chan struct{})
	first := make(chan struct{})
	go func() { attach(socks, srv, cli, stop); close(first) }()
	if _, err := cli.Write([]byte("a")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(srv, make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	close(stop)
	<-first
	other := New(Config{Listener: true})
	_, err := attach(socks, other, cli, nil)
	if !errors.Is(err, ErrOtherStream) || !errors.Is(cli.Err(), ErrOtherStream) {
		t.Fatalf("the dialer went on with another stream: %v, stream %v", err, cli.Err())
	}
	if _, err := cli.Read(make([]byte, 1)); !errors.Is(err, ErrOtherStream) {
		t.Fatalf("read after the far end restarted: %v", err)
	}
}

// TestStranger: a listener with history refuses a dialer that is new to it, and goes on;
// the stranger does not cut the attached peer's connection.
func TestStranger(t *testing.T) {
	socks := newSockets(t)
	srv := New(Config{Listener: true})
	cli := New(Config{})
	stop := make(chan struct{})
	first := make(chan struct{})
	go func() { attach(socks, srv, cli, stop); close(first) }()
	cli.Write([]byte("a"))
	io.ReadFull(srv, make([]byte, 1))
	a, b := socks.pair()
	go func() {
		b.Write(hello{}.encode())
		io.Copy(io.Discard, b)
	}()
	if err := srv.Attach(a); !errors.Is(err, ErrStranger) || srv.Err() != nil {
		t.Fatalf("listener: %v, stream %v", err, srv.Err())
	}
	b.Close()
	// The peer's connection is still the attached one.
	if _, detached := srv.Detached(); detached {
		t.Fatal("a stranger cut the peer's connection")
	}
	cli.Write([]byte("b"))
	if _, err := io.ReadFull(srv, make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	close(stop)
	<-first
}

// TestGap: a peer whose count is below what it acknowledged cannot be replayed to.
func TestGap(t *testing.T) {
	s := New(Config{})
	s.mu.Lock()
	s.id, s.known = ID{1}, true
	s.sent, s.acked = 10, 5
	s.out = make([]byte, 5)
	err := s.admit(s.gen, &hello{id: ID{1}, recv: 3}, io.NopCloser(nil))
	s.mu.Unlock()
	if !errors.Is(err, ErrGap) || !errors.Is(s.Err(), ErrGap) {
		t.Fatalf("admit: %v", err)
	}
	s = New(Config{})
	s.mu.Lock()
	s.id, s.known = ID{1}, true
	s.sent = 10
	s.out = make([]byte, 10)
	err = s.admit(s.gen, &hello{id: ID{1}, recv: 12}, io.NopCloser(nil))
	s.mu.Unlock()
	if !errors.Is(err, ErrGap) {
		t.Fatalf("a count past what was sent: %v", err)
	}
}

// TestSilentLinkDetaches: a connection over which nothing arrives any more (a link that
// went down without the transport noticing) is dropped after three keepalives, so the
// stream counts as detached.
func TestSilentLinkDetaches(t *testing.T) {
	socks := newSockets(t)
	srv := New(Config{Listener: true, Keepalive: 20 * time.Millisecond})
	a, b := socks.pair()
	defer b.Close()
	// b answers the hello and then says nothing: a peer behind a dead link.
	go func() {
		b.Write(hello{}.encode())
		io.Copy(io.Discard, b)
	}()
	err := srv.Attach(a)
	if err == nil || srv.Err() != nil {
		t.Fatalf("attach: %v, stream: %v", err, srv.Err())
	}
	if _, ok := srv.Detached(); !ok {
		t.Fatal("the stream is attached to a silent connection")
	}
}

// TestNewEpoch: a dialer that lost the stream's state (klbr-core restarted) asks for a new
// epoch. The listener refuses it while another connection is attached (never two peers, and
// the attached one undisturbed); once detached it drops what was in flight both ways, says so
// once to its reader and to a writer the epoch cut, and the new dialer sees only what was
// written after. The old dialer is a stranger then, and learns that its stream is gone; the
// new one resumes over later connections as any dialer does.
func TestNewEpoch(t *testing.T) {
	socks := newSockets(t)
	srv := New(Config{Listener: true, Window: 8})
	old := New(Config{})
	stop := make(chan struct{})
	res := make(chan error, 1)
	go func() { _, err := attach(socks, srv, old, stop); res <- err }()
	if _, err := old.Write([]byte("a")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(srv, make([]byte, 1)); err != nil {
		t.Fatal(err)
	}

	// A new epoch while old is attached: refused, old undisturbed.
	fresh := New(Config{NewEpoch: true})
	never := make(chan struct{})
	errSrv, errCli := attach(socks, srv, fresh, never)
	if !errors.Is(errSrv, ErrAttached) || errCli == nil || fresh.Err() != nil {
		t.Fatalf("a new epoch while attached: listener %v, dialer %v (stream %v)", errSrv, errCli, fresh.Err())
	}
	old.Write([]byte("b"))
	if _, err := io.ReadFull(srv, make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	close(stop)
	<-res

	// In flight, both ways, as the old dialer dies: its bytes never arrive, and the
	// listener's are not acknowledged; a writer blocks on the full window.
	old.Write([]byte("lost-up"))
	srv.Write([]byte("lost-dn"))
	cut := make(chan error, 1)
	go func() { _, err := srv.Write([]byte("cut-by-the-epoch")); cut <- err }()
	time.Sleep(20 * time.Millisecond)

	stop = make(chan struct{})
	go func() { _, err := attach(socks, srv, fresh, stop); res <- err }()
	if err := <-cut; !errors.Is(err, ErrNewEpoch) {
		t.Fatalf("a write cut by the new epoch: %v", err)
	}
	if _, err := srv.Read(make([]byte, 8)); !errors.Is(err, ErrNewEpoch) {
		t.Fatalf("the listener's first read after the epoch: %v; want ErrNewEpoch", err)
	}
	fresh.Write([]byte("new-up"))
	got := make([]byte, 6)
	if _, err := io.ReadFull(srv, got); err != nil || string(got) != "new-up" {
		t.Fatalf("the listener read %q %v", got, err)
	}
	srv.Write([]byte("new-dn"))
	if _, err := io.ReadFull(fresh, got); err != nil || string(got) != "new-dn" {
		t.Fatalf("the new dialer read %q %v; want only what was written after the epoch", got, err)
	}
	if srv.ID() != fresh.ID() || srv.ID() == old.ID() {
		t.Fatalf("ids: listener %s, new dialer %s, old %s", srv.ID(), fresh.ID(), old.ID())
	}
	close(stop)
	<-res

	// The old dialer comes back: the listener refuses it, and it learns its stream is gone.
	never = make(chan struct{})
	errSrv, _ = attach(socks, srv, old, never)
	if !errors.Is(errSrv, ErrStranger) || !errors.Is(old.Err(), ErrOtherStream) {
		t.Fatalf("the old dialer after the epoch: listener %v, its stream %v", errSrv, old.Err())
	}

	// The new dialer resumes after a drop like any dialer: no second epoch.
	stop = make(chan struct{})
	go func() { _, err := attach(socks, srv, fresh, stop); res <- err }()
	fresh.Write([]byte("again"))
	got = make([]byte, 5)
	if _, err := io.ReadFull(srv, got); err != nil || string(got) != "again" {
		t.Fatalf("after a drop the listener read %q %v", got, err)
	}
	close(stop)
	<-res
	if srv.Err() != nil || fresh.Err() != nil {
		t.Fatalf("streams ended: %v %v", srv.Err(), fresh.Err())
	}
}
