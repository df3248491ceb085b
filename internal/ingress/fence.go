package ingress

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"

	"golang.org/x/sys/unix"

	"github.com/klbr-dev/klbr/internal/ingress/ingressapi"
	"github.com/klbr-dev/klbr/internal/unixsock"
)

// One sender: the transport that said hello holds a fencing token, and
// claims, receipts and read answers must carry it. A second transport's
// hello is refused while the first one's process lives; once it is gone
// (a restart of klbr-discord) the next hello takes over and the old token
// stops working. After klbr-core restarts nobody holds the token: a claim
// with one it does not know is told to say hello again, and the hellos
// compete as above.

// sender is the transport that may deliver.
type sender struct {
	token    string
	pid      int32
	instance string
}

// takeSender makes the hello's peer the sender and returns its token, or
// refuses it while another live process is the sender.
func (s *Server) takeSender(r *http.Request, instance string) (string, error) {
	cred, _ := unixsock.FromContext(r.Context())
	s.mu.Lock()
	defer s.mu.Unlock()
	if cur := s.sender; cur != nil && cur.pid != cred.PID && processAlive(cur.pid) {
		return "", fmt.Errorf("another klbr-discord (pid %d, instance %s) delivers for this data directory; stop it first: two transports would both deliver", cur.pid, cur.instance)
	}
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	s.sender = &sender{token: hex.EncodeToString(b), pid: cred.PID, instance: instance}
	return s.sender.token, nil
}

// fenced admits a request only with the sender's token. A request without
// any token is served while no transport has said hello (a client of the
// API that does not deliver through hello, such as a test).
func (s *Server) fenced(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		token := r.Header.Get(ingressapi.FenceHeader)
		s.mu.Lock()
		cur := s.sender
		s.mu.Unlock()
		switch {
		case cur == nil && token == "":
		case cur == nil:
			writeError(w, http.StatusConflict, ingressapi.CodeFenced, "klbr-core restarted and knows no sender: say hello again")
			return
		case token != cur.token:
			writeError(w, http.StatusConflict, ingressapi.CodeFenced,
				fmt.Sprintf("this transport is not the sender (klbr-discord pid %d, instance %s, is): say hello again, or stop", cur.pid, cur.instance))
			return
		}
		next(w, r)
	}
}

// processAlive reports whether pid names a live process (one of another
// user counts: klbr-discord may run under its own).
func processAlive(pid int32) bool {
	if pid <= 0 {
		return false
	}
	err := unix.Kill(int(pid), 0)
	if err != nil && !errors.Is(err, unix.EPERM) {
		return false
	}
	// A zombie (dead, not yet reaped) does not deliver.
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
		if i := bytes.LastIndexByte(b, ')'); i > 0 && i+2 < len(b) && b[i+2] == 'Z' {
			return false
		}
	}
	return true
}
