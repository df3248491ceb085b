package httpguard

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"testing"
	"testing/synctest"
	"time"
)

// pipeListener hands out the server ends of net.Pipe connections (durably blocking, so a
// synctest bubble can tell when everything waits).
type pipeListener struct {
	conns chan net.Conn
	done  chan struct{}
}

func newPipeListener() *pipeListener {
	return &pipeListener{conns: make(chan net.Conn), done: make(chan struct{})}
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}
func (l *pipeListener) Close() error   { close(l.done); return nil }
func (l *pipeListener) Addr() net.Addr { return &net.UnixAddr{Name: "pipe", Net: "unix"} }

// dial connects a client; the server end waits for Accept.
func (l *pipeListener) dial() net.Conn {
	client, server := net.Pipe()
	go func() { l.conns <- server }()
	return client
}

// closedByServer reports whether the server has closed c's other end.
func closedByServer(c net.Conn) bool {
	c.SetReadDeadline(time.Now().Add(time.Millisecond))
	_, err := c.Read(make([]byte, 1))
	c.SetReadDeadline(time.Time{})
	return errors.Is(err, io.EOF)
}

// A new connection over the strangers' bound closes the oldest stranger, but only once
// that one has had StrangerGrace: Accept waits until then.
func TestGateClosesTheOldestStrangerAfterItsGrace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		pl := newPipeListener()
		g := NewGate(Limits{Strangers: 2, Stranger: time.Minute})
		l := g.Listener(pl)
		defer l.Close()
		var clients []net.Conn
		for range 2 {
			clients = append(clients, pl.dial())
			if _, err := l.Accept(); err != nil {
				t.Fatal(err)
			}
		}
		third := pl.dial()
		start := time.Now()
		if _, err := l.Accept(); err != nil {
			t.Fatal(err)
		}
		if waited := time.Since(start); waited != StrangerGrace {
			t.Fatalf("the third connection was let in after %v, want the first's grace %v", waited, StrangerGrace)
		}
		if !closedByServer(clients[0]) || closedByServer(clients[1]) || closedByServer(third) {
			t.Fatal("want the oldest stranger closed, the others open")
		}
		if st := g.Stats(); st.Strangers != 2 || st.Evicted != 1 {
			t.Fatalf("stats %+v", st)
		}
	})
}

// A stranger is closed at the end of its life; a trusted connection is not, and takes one
// of the trusted places, of which there are Limits.MaxConns.
func TestGateStrangerLifeAndTrustedPlaces(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		pl := newPipeListener()
		g := NewGate(Limits{Strangers: 8, Stranger: 3 * time.Second, MaxConns: 1})
		l := g.Listener(pl)
		defer l.Close()
		accept := func() (net.Conn, net.Conn) {
			c := pl.dial()
			s, err := l.Accept()
			if err != nil {
				t.Fatal(err)
			}
			return c, s
		}
		stranger, _ := accept()
		operator, opServer := accept()
		other, otherServer := accept()
		if !g.trust(opServer.(*gateConn)) {
			t.Fatal("the first trusted connection was refused")
		}
		if g.trust(otherServer.(*gateConn)) {
			t.Fatal("a second trusted connection was let in over MaxConns 1")
		}
		time.Sleep(3 * time.Second)
		synctest.Wait()
		if !closedByServer(stranger) || !closedByServer(other) || closedByServer(operator) {
			t.Fatal("want the strangers closed at the end of their life, the operator's connection open")
		}
		if st := g.Stats(); st.Trusted != 1 || st.Strangers != 0 || st.Expired != 2 {
			t.Fatalf("stats %+v", st)
		}
		opServer.Close()
		if st := g.Stats(); st.Trusted != 0 {
			t.Fatalf("a closed trusted connection still holds its place: %+v", st)
		}
	})
}

// Over HTTP: a request that does not call Trust is answered "Connection: close" and its
// connection ends; one that does keeps its connection alive for the next request.
func TestGateClosesStrangersAfterTheirAnswer(t *testing.T) {
	pl := newPipeListener()
	g := NewGate(Limits{})
	srv := g.Serve(&http.Server{Handler: g.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Token") == "ok" && !Trust(w, r) {
			http.Error(w, "full", http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("hi"))
	}))})
	go srv.Serve(g.Listener(pl))
	defer srv.Close()

	for _, tc := range []struct {
		name  string
		token string
		close bool
	}{{"stranger", "", true}, {"trusted", "ok", false}} {
		c := pl.dial()
		br := bufio.NewReader(c)
		for i := range 2 {
			req, _ := http.NewRequest("GET", "http://127.0.0.1/", nil)
			if tc.token != "" {
				req.Header.Set("X-Token", tc.token)
			}
			c.SetDeadline(time.Now().Add(10 * time.Second))
			if err := req.Write(c); err != nil {
				if tc.close && i == 1 {
					break // the server closed the connection
				}
				t.Fatalf("%s: request %d: %v", tc.name, i, err)
			}
			resp, err := http.ReadResponse(br, req)
			if err != nil {
				if tc.close && i == 1 {
					break
				}
				t.Fatalf("%s: response %d: %v", tc.name, i, err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.Close != tc.close {
				t.Fatalf("%s: response %d says close=%v, want %v", tc.name, i, resp.Close, tc.close)
			}
			if tc.close && i == 1 {
				t.Fatalf("%s: a second request was answered on a stranger's connection", tc.name)
			}
		}
		c.Close()
	}
}
