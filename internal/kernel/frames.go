package kernel

import (
	"bufio"
	"encoding/binary"
	"errors"
	"io"

	"github.com/klbr-dev/klbr/internal/resume"
)

// MaxProtocolFrame bounds one frame's payload of the worker protocol
// (docs/worker-protocol.md: a 4-byte big-endian length N, then N bytes).
const MaxProtocolFrame = 1 << 20

// The bridge of --listen carries whole frames of the worker protocol, so
// that a new epoch of the resumable stream (a restarted klbr-core took the
// worker over: resume.ErrNewEpoch) falls between two frames on both sides:
// Python never reads half a frame of a dead klbr-core's followed by the new
// one's, and the new klbr-core's first byte is the start of a frame. What a
// new epoch cuts (a frame written before it and not acknowledged, a frame
// half received) is dropped: it was in flight when its klbr-core died.
//
// A length outside 1..MaxProtocolFrame is not the protocol: the bridge
// passes the bytes on as they are, and the reader at the end refuses them
// (klbr-core's ReadFrame, or the runtime's).

// framesToStream copies the child's frames into the stream, one Write each.
func framesToStream(s *resume.Stream, child io.Reader) error {
	r := bufio.NewReaderSize(child, 64<<10)
	var buf []byte
	for {
		var hdr [4]byte
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return err
		}
		n := binary.BigEndian.Uint32(hdr[:])
		if n == 0 || n > MaxProtocolFrame {
			if _, err := s.Write(hdr[:]); err != nil {
				return err
			}
			_, err := io.Copy(s, r)
			return err
		}
		buf = frameBuf(buf, hdr, n)
		if _, err := io.ReadFull(r, buf[4:]); err != nil {
			return err
		}
		if _, err := s.Write(buf); err != nil && !errors.Is(err, resume.ErrNewEpoch) {
			return err
		}
		if cap(buf) > 64<<10 {
			buf = nil // a big frame's buffer is not kept
		}
	}
}

// framesFromStream copies the stream's frames to the child, each once it
// has arrived whole; a new epoch drops the frame it cut.
func framesFromStream(child io.Writer, s *resume.Stream) error {
	var buf []byte
	for {
		var hdr [4]byte
		if _, err := io.ReadFull(s, hdr[:]); err != nil {
			if errors.Is(err, resume.ErrNewEpoch) {
				continue
			}
			return err
		}
		n := binary.BigEndian.Uint32(hdr[:])
		if n == 0 || n > MaxProtocolFrame {
			if _, err := child.Write(hdr[:]); err != nil {
				return err
			}
			_, err := copyAcrossEpochs(child, s)
			return err
		}
		buf = frameBuf(buf, hdr, n)
		if _, err := io.ReadFull(s, buf[4:]); err != nil {
			if errors.Is(err, resume.ErrNewEpoch) {
				continue
			}
			return err
		}
		if _, err := child.Write(buf); err != nil {
			return err
		}
		if cap(buf) > 64<<10 {
			buf = nil
		}
	}
}

// frameBuf is buf resized to hold a frame of header hdr and n bytes.
func frameBuf(buf []byte, hdr [4]byte, n uint32) []byte {
	if uint32(cap(buf)) < 4+n {
		buf = make([]byte, 4+n)
	}
	buf = buf[:4+n]
	copy(buf, hdr[:])
	return buf
}

// copyAcrossEpochs is io.Copy from a stream that may begin new epochs.
func copyAcrossEpochs(w io.Writer, s *resume.Stream) (int64, error) {
	var total int64
	for {
		n, err := io.Copy(w, s)
		total += n
		if !errors.Is(err, resume.ErrNewEpoch) {
			return total, err
		}
	}
}
