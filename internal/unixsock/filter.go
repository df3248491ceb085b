package unixsock

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"
)

// maxRefusing bounds the refusals written at once by a FilterWorkers listener; past it a
// worker's connection is closed without an answer.
const maxRefusing = 8

// FilterWorkers returns a listener that hands on only connections whose peer is not a klbr
// worker (classify, as in ConnContextClassified). A worker's connection is answered
// "403 forbidden" (JSON, the APIs' error shape) by a goroutine of its own, a few at a
// time, and closed: it never takes one of the listener's connection slots, so a cell that
// opens connections to control.sock by the hundred cannot starve the operator.
func FilterWorkers(l net.Listener, classify func(pid int) string) net.Listener {
	return &filterListener{Listener: l, classify: classify, sem: make(chan struct{}, maxRefusing)}
}

type filterListener struct {
	net.Listener
	classify func(pid int) string
	sem      chan struct{} // one token per refusal being written
	wg       sync.WaitGroup
}

func (l *filterListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		uc, ok := unwrap(c).(*net.UnixConn)
		if !ok {
			return c, nil
		}
		cred, err := PeerCred(uc)
		if err != nil {
			return c, nil // the handler's peer check refuses it
		}
		why := l.classify(int(cred.PID))
		if why == "" {
			return c, nil
		}
		select {
		case l.sem <- struct{}{}:
			l.wg.Go(func() {
				defer func() { <-l.sem }()
				refuse(c, why)
			})
		default:
			c.Close()
		}
	}
}

// Close closes the listener and waits for the refusals being written (each bounded).
func (l *filterListener) Close() error {
	err := l.Listener.Close()
	l.wg.Wait()
	return err
}

// refuse reads the request (so the close sends no reset over an unread request), answers
// 403 and closes, all within two seconds.
func refuse(c net.Conn, why string) {
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	if req, err := http.ReadRequest(bufio.NewReaderSize(c, 4096)); err == nil {
		req.Body.Close()
	}
	body, _ := json.Marshal(map[string]any{"error": map[string]string{"code": "forbidden",
		"message": "this socket does not serve klbr workers or their descendants (the peer is " + why + "): a cell has no operator or transport authority"}})
	fmt.Fprintf(c, "HTTP/1.1 403 Forbidden\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(body), body)
}
