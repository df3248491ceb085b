package resume

import (
	"bufio"
	"bytes"
	"testing"
)

func FuzzHello(f *testing.F) {
	f.Add(hello{id: ID{1, 2, 3}, recv: 42}.encode())
	f.Add([]byte("KLBRRS01"))
	f.Add(hello{id: ID{9}, recv: 0, epoch: true}.encode())
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := decodeHello(b)
		if err != nil {
			return
		}
		if !bytes.Equal(h.encode(), b) {
			t.Fatalf("hello %x decodes to %+v, which encodes differently", b, h)
		}
	})
}

func FuzzFrame(f *testing.F) {
	f.Add(appendData(nil, 7, []byte("abc")))
	f.Add(appendCount(appendCount(nil, frameAck, 9), frameFin, 3))
	f.Add([]byte{'D', 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		r := bufio.NewReader(bytes.NewReader(b))
		buf := make([]byte, MaxFrame)
		var again []byte
		for {
			fr, err := readFrame(r, buf)
			if err != nil {
				break
			}
			if len(fr.data) > MaxFrame {
				t.Fatalf("a frame of %d bytes", len(fr.data))
			}
			switch fr.kind {
			case frameData:
				again = appendData(again, fr.n, fr.data)
			default:
				again = appendCount(again, fr.kind, fr.n)
			}
		}
		if !bytes.HasPrefix(b, again) {
			t.Fatalf("frames of %x re-encode to %x", b, again)
		}
	})
}
