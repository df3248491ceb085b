package httpguard

import (
	"encoding/binary"
	"errors"
	"testing"
)

// header is a client frame header declaring n bytes (FIN, text, masked).
func header(n uint64) []byte {
	h := []byte{0x81}
	switch {
	case n < 126:
		h = append(h, 0x80|byte(n))
	case n <= 0xffff:
		h = binary.BigEndian.AppendUint16(append(h, 0x80|126), uint16(n))
	default:
		h = binary.BigEndian.AppendUint64(append(h, 0x80|127), n)
	}
	return append(h, 9, 9, 9, 9)
}

func frame(n int) []byte { return append(header(uint64(n)), make([]byte, n)...) }

func TestFrameScanner(t *testing.T) {
	cat := func(bs ...[]byte) (out []byte) {
		for _, b := range bs {
			out = append(out, b...)
		}
		return out
	}
	for _, tc := range []struct {
		name   string
		stream []byte
		bad    bool
	}{
		{"small frames", cat(frame(0), frame(5), frame(125)), false},
		{"16-bit length at the limit", cat(frame(1000), frame(5)), false},
		{"16-bit length over the limit", frame(1001), true},
		{"2^62 declared", header(1 << 62), true},
		{"2^63 declared", header(1 << 63), true},
		// The payload of a frame is skipped, never read as a header: these bytes would
		// declare 2^62 if they were.
		{"a payload that looks like a huge header", cat(header(14), header(1<<62), frame(3)), false},
		{"huge header after good frames", cat(frame(10), frame(1000), header(1<<62)), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			whole := FrameScanner{Max: 1000}
			errWhole := whole.Scan(tc.stream)
			byByte := FrameScanner{Max: 1000}
			var errByte error
			for i := range tc.stream {
				if errByte = byByte.Scan(tc.stream[i : i+1]); errByte != nil {
					break
				}
			}
			if (errWhole != nil) != tc.bad || (errByte != nil) != tc.bad {
				t.Fatalf("whole: %v, byte by byte: %v; want refused=%v", errWhole, errByte, tc.bad)
			}
			if tc.bad && !errors.Is(errWhole, ErrFrameTooLarge) {
				t.Fatalf("error %v is not ErrFrameTooLarge", errWhole)
			}
		})
	}
}

// The length is judged as soon as its bytes are in: no mask key or payload is awaited.
func TestFrameScannerRefusesBeforeTheMaskKey(t *testing.T) {
	s := FrameScanner{Max: 1 << 20}
	h := header(1 << 62)
	if err := s.Scan(h[:10]); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("after the length bytes: %v", err)
	}
}

// FuzzFrameScanner: whatever the stream and however it is cut, the scanner does not
// panic, decides the same, and refuses exactly when some header declares over Max.
// Seeds in testdata/fuzz/FuzzFrameScanner.
func FuzzFrameScanner(f *testing.F) {
	f.Add(append(frame(3), header(1<<62)...), uint8(1))
	f.Add(append(frame(200), frame(70000)...), uint8(7))
	f.Fuzz(func(t *testing.T, stream []byte, cut uint8) {
		whole := FrameScanner{Max: 65536}
		errWhole := whole.Scan(stream)
		step := int(cut)%16 + 1
		pieces := FrameScanner{Max: 65536}
		var errPieces error
		for i := 0; i < len(stream) && errPieces == nil; i += step {
			errPieces = pieces.Scan(stream[i:min(len(stream), i+step)])
		}
		if (errWhole == nil) != (errPieces == nil) {
			t.Fatalf("whole: %v; in pieces of %d: %v", errWhole, step, errPieces)
		}
		if errWhole != nil && !errors.Is(errWhole, ErrFrameTooLarge) {
			t.Fatalf("unexpected error %v", errWhole)
		}
	})
}
