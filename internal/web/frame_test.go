package web

import (
	"bufio"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"
)

// rawSocket opens /v2/ws with the token over a bare TCP connection and returns it once
// the server has switched protocols.
func rawSocket(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, "GET /v2/ws HTTP/1.1\r\nHost: "+addr+"\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\nCookie: "+CookieName+"="+testToken+"\r\n\r\n")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %s", resp.Status)
	}
	c.SetDeadline(time.Time{})
	return c, br
}

// frameHeader is a client frame's header (FIN, opcode, masked) declaring n bytes of
// payload, with its masking key.
func frameHeader(opcode byte, n uint64) []byte {
	h := []byte{0x80 | opcode}
	switch {
	case n < 126:
		h = append(h, 0x80|byte(n))
	case n <= 0xffff:
		h = append(h, 0x80|126)
		h = binary.BigEndian.AppendUint16(h, uint16(n))
	default:
		h = append(h, 0x80|127)
		h = binary.BigEndian.AppendUint64(h, n)
	}
	return append(h, 1, 2, 3, 4)
}

// maskedText is a whole client text frame.
func maskedText(s string) []byte {
	f := frameHeader(0x1, uint64(len(s)))
	key := f[len(f)-4:]
	for i := range len(s) {
		f = append(f, s[i]^key[i%4])
	}
	return f
}

// A frame header that declares 2^62 bytes of payload ends the connection at once, before
// the hello and after it: the server neither waits for the payload nor reads towards its
// limit (the library alone would wait for the bytes until the client leaves).
func TestHugeFrameHeaderClosesAtOnce(t *testing.T) {
	for _, afterHello := range []bool{false, true} {
		name := "before-hello"
		if afterHello {
			name = "after-hello"
		}
		t.Run(name, func(t *testing.T) {
			h := start(t)
			c, br := rawSocket(t, strings.TrimPrefix(h.http.URL, "http://"))
			if afterHello {
				c.Write(maskedText(`{"type":"hello","session":"default","cursor":0}`))
			}
			c.Write(frameHeader(0x1, 1<<62))
			// Far shorter than the hello timeout (10 s), and the socket has no other
			// read timeout after the hello: only a prompt close passes.
			c.SetReadDeadline(time.Now().Add(3 * time.Second))
			_, err := io.Copy(io.Discard, br)
			if errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatal("the connection is still open 3 s after a frame header declaring 2^62 bytes")
			}
			for deadline := time.Now().Add(5 * time.Second); !strings.Contains(h.logs.String(), "declared a payload over the limit"); {
				if time.Now().After(deadline) {
					t.Fatalf("the log does not say why the socket was closed:\n%s", h.logs.String())
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}
