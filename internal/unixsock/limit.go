package unixsock

import (
	"net"
	"sync"
)

// LimitListener returns a listener that holds at most n accepted connections open at once:
// Accept waits while n are open, so a flood of idle connections on one listener costs at
// most n file descriptors and leaves the daemon's other listeners (and its operator
// socket) alone. n <= 0 means no limit.
func LimitListener(l net.Listener, n int) net.Listener {
	if n <= 0 {
		return l
	}
	return &limitListener{Listener: l, sem: make(chan struct{}, n), done: make(chan struct{})}
}

type limitListener struct {
	net.Listener
	sem       chan struct{} // one token per open connection
	closeOnce sync.Once
	done      chan struct{} // closed by Close: a waiting Accept returns
}

func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.sem <- struct{}{}:
	case <-l.done:
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.sem
		return nil, err
	}
	return &limitConn{Conn: c, release: func() { <-l.sem }}, nil
}

func (l *limitListener) Close() error {
	err := l.Listener.Close()
	l.closeOnce.Do(func() { close(l.done) })
	return err
}

// limitConn gives its token back once, at Close. It keeps the concrete type reachable for
// SO_PEERCRED through Unwrap.
type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// Unwrap returns the connection underneath.
func (c *limitConn) Unwrap() net.Conn { return c.Conn }
