package worker

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"testing"
)

// FuzzReadFrame feeds arbitrary byte streams to the frame reader: it must
// never panic, never read a frame over the bound, and report every malformed
// stream as ErrProtocol (or a clean io.EOF at a boundary).
func FuzzReadFrame(f *testing.F) {
	frame := func(s string) []byte {
		b := make([]byte, 4+len(s))
		binary.BigEndian.PutUint32(b, uint32(len(s)))
		copy(b[4:], s)
		return b
	}
	f.Add(frame(`{"v":1,"type":"hello","session":"s","generation":1}`))
	f.Add(frame(`{"v":1,"type":"output","data":"\u00e9"}`))
	f.Add([]byte{0, 0, 0, 0})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, '{'})
	f.Add(frame(`[1]`))
	f.Fuzz(func(t *testing.T, stream []byte) {
		r := bytes.NewReader(stream)
		for {
			fr, err := ReadFrame(r)
			if err != nil {
				if !errors.Is(err, io.EOF) && !errors.Is(err, ErrProtocol) {
					t.Fatalf("error is neither EOF nor ErrProtocol: %v", err)
				}
				return
			}
			if fr.Type == "" {
				t.Fatal("accepted a frame without a type")
			}
			var buf bytes.Buffer
			if err := WriteFrame(&buf, fr); err != nil {
				t.Fatalf("re-encode: %v", err)
			}
			back, err := ReadFrame(&buf)
			if err != nil || back.Type != fr.Type || back.Execution != fr.Execution || back.Data != fr.Data {
				t.Fatalf("round trip: %+v → %+v (%v)", fr, back, err)
			}
		}
	})
}
