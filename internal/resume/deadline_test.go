package resume

import (
	"errors"
	"net"
	"os"
	"testing"
	"time"
)

// Read and Write give up at their deadlines with a timeout (as a net.Conn's
// do), a deadline set while one waits applies to it, and a cleared one
// waits again; data that arrives before the deadline is read.
func TestDeadlines(t *testing.T) {
	s := New(Config{Window: 16})
	s.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	_, err := s.Read(make([]byte, 8))
	var ne net.Error
	if !errors.Is(err, os.ErrDeadlineExceeded) || !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("Read past its deadline: %v", err)
	}

	s.SetReadDeadline(time.Time{})
	got := make(chan error, 1)
	go func() {
		_, err := s.Read(make([]byte, 8))
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("Read without a deadline returned: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	s.SetReadDeadline(time.Now()) // applies to the waiting Read
	if err := <-got; !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a waiting Read after its deadline: %v", err)
	}

	// No connection: the window fills, and Write gives up at its deadline
	// having queued what fitted.
	s.SetWriteDeadline(time.Now().Add(20 * time.Millisecond))
	n, err := s.Write(make([]byte, 40))
	if n != 16 || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Write into a full window past its deadline: %d, %v", n, err)
	}

	// A peer's bytes that arrive in time are read.
	socks := newSockets(t)
	srv, cli := New(Config{Listener: true}), New(Config{})
	stop := make(chan struct{})
	defer close(stop)
	go attach(socks, srv, cli, stop)
	cli.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := srv.Write([]byte("hi")); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 2)
	if _, err := cli.Read(b); err != nil || string(b) != "hi" {
		t.Fatalf("Read before the deadline: %q %v", b, err)
	}
}
