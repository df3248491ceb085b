package httpguard

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
)

// ErrFrameTooLarge is a WebSocket frame whose header declares more payload than the
// socket accepts.
var ErrFrameTooLarge = errors.New("websocket frame header declares a payload over the limit")

// LimitFrames wraps w so that a WebSocket accepted on it (a Hijack) fails its reads the
// moment a client frame's header declares more than max bytes of payload (with
// ErrFrameTooLarge), before any of that payload is awaited or read; the socket's owner
// then closes it. A read limit on the socket alone
// (coder/websocket's SetReadLimit) only fails once max bytes have arrived, so a header
// that declares 2^62 bytes and sends none holds the connection for as long as the client
// likes.
func LimitFrames(w http.ResponseWriter, max int64) http.ResponseWriter {
	return &frameLimitWriter{ResponseWriter: w, max: uint64(max)}
}

type frameLimitWriter struct {
	http.ResponseWriter
	max uint64
}

// Unwrap lets http.ResponseController reach the server's writer.
func (w *frameLimitWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Hijack hands out the connection with its reads passed through the frame scanner,
// bytes the server had already buffered first.
func (w *frameLimitWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, brw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err != nil {
		return nil, nil, err
	}
	buffered, _ := brw.Reader.Peek(brw.Reader.Buffered())
	fc := &frameConn{Conn: c, r: io.MultiReader(bytes.NewReader(bytes.Clone(buffered)), c), scan: FrameScanner{Max: w.max}}
	return fc, bufio.NewReadWriter(bufio.NewReader(fc), brw.Writer), nil
}

// frameConn is a hijacked connection whose incoming bytes are scanned for frame headers.
type frameConn struct {
	net.Conn
	r      io.Reader
	scan   FrameScanner
	failed error
}

func (c *frameConn) Read(p []byte) (int, error) {
	if c.failed != nil {
		return 0, c.failed
	}
	n, err := c.r.Read(p)
	if serr := c.scan.Scan(p[:n]); serr != nil {
		// Every read from now on fails: the socket's reader gives up at once, and its
		// owner closes the connection (a close frame may still go out).
		c.failed = serr
		return 0, serr
	}
	return n, err
}

// Unwrap returns the connection underneath.
func (c *frameConn) Unwrap() net.Conn { return c.Conn }

// FrameScanner follows a stream of client WebSocket frames (RFC 6455 §5.2) by their
// headers alone: it skips each payload without looking at it and fails on the first
// header whose declared length is over Max, as soon as the length's bytes are in. It
// holds at most one header (14 bytes) whatever it is fed.
type FrameScanner struct {
	Max uint64

	hdr    [14]byte
	n      int    // header bytes held
	length uint64 // the payload length of the header being read, once known
	skip   uint64 // payload bytes of the current frame still to pass
}

// Scan passes the next bytes of the stream.
func (s *FrameScanner) Scan(p []byte) error {
	for len(p) > 0 {
		if s.skip > 0 {
			k := min(uint64(len(p)), s.skip)
			s.skip -= k
			p = p[k:]
			continue
		}
		s.hdr[s.n] = p[0]
		s.n++
		p = p[1:]
		if s.n < 2 {
			continue
		}
		ext := 0
		switch s.hdr[1] & 0x7f {
		case 126:
			ext = 2
		case 127:
			ext = 8
		}
		mask := 0
		if s.hdr[1]&0x80 != 0 {
			mask = 4
		}
		if s.n == 2+ext {
			var length uint64
			switch ext {
			case 0:
				length = uint64(s.hdr[1] & 0x7f)
			case 2:
				length = uint64(binary.BigEndian.Uint16(s.hdr[2:4]))
			case 8:
				length = binary.BigEndian.Uint64(s.hdr[2:10])
			}
			if length > s.Max {
				return fmt.Errorf("%w: %d bytes declared, at most %d accepted", ErrFrameTooLarge, length, s.Max)
			}
			s.length = length
		}
		if s.n == 2+ext+mask {
			s.n, s.skip = 0, s.length // the payload follows
		}
	}
	return nil
}
