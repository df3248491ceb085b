package resume

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// The wire format. A connection begins with a hello from each side:
//
//	"KLBRRS01" | stream id (16 bytes) | count received (uint64, big-endian)
//
// or, from a dialer that lost the stream's state (a restarted klbr-core: Config.NewEpoch),
// until the listener has taken it:
//
//	"KLBRRE01" | the new epoch's stream id, drawn by the dialer | count received
//
// then carries frames:
//
//	'D' | offset (uint64) | length (uint32, 1..MaxFrame) | bytes   data at offset
//	'A' | count (uint64)                                           everything below count received
//	'F' | offset (uint64)                                          the end of the stream, at offset
//
// Positions count the stream's bytes and then its end (the 'F'), which takes one position:
// a count of N+1 after N bytes says the end arrived too.

const (
	helloMagic = "KLBRRS01"
	epochMagic = "KLBRRE01"
	helloSize  = len(helloMagic) + 16 + 8
	// MaxFrame is the most bytes one data frame carries.
	MaxFrame = 32 << 10

	frameData = 'D'
	frameAck  = 'A'
	frameFin  = 'F'
)

// ID names a stream: the listening side draws it at start, the dialing side learns it on
// its first connection and then refuses a listener with another (a restarted far end).
type ID [16]byte

func (id ID) String() string { return fmt.Sprintf("%x", id[:]) }

type hello struct {
	id   ID
	recv uint64
	// epoch: the dialer lost what it had of the stream and asks the listener to begin a
	// new epoch named id, dropping what either side had in flight.
	epoch bool
}

func (h hello) encode() []byte {
	b := make([]byte, 0, helloSize)
	if h.epoch {
		b = append(b, epochMagic...)
	} else {
		b = append(b, helloMagic...)
	}
	b = append(b, h.id[:]...)
	return binary.BigEndian.AppendUint64(b, h.recv)
}

// errProtocol marks a peer that broke the wire format: the connection is dropped.
var errProtocol = errors.New("resume: protocol violation")

// decodeHello reads a hello from exactly helloSize bytes.
func decodeHello(b []byte) (hello, error) {
	if len(b) != helloSize {
		return hello{}, fmt.Errorf("%w: hello of %d bytes", errProtocol, len(b))
	}
	var h hello
	switch string(b[:len(helloMagic)]) {
	case helloMagic:
	case epochMagic:
		h.epoch = true
	default:
		return hello{}, fmt.Errorf("%w: not a resumable stream (bad magic)", errProtocol)
	}
	copy(h.id[:], b[len(helloMagic):len(helloMagic)+16])
	h.recv = binary.BigEndian.Uint64(b[len(helloMagic)+16:])
	return h, nil
}

func readHello(r io.Reader) (hello, error) {
	b := make([]byte, helloSize)
	if _, err := io.ReadFull(r, b); err != nil {
		return hello{}, err
	}
	return decodeHello(b)
}

type frame struct {
	kind byte
	n    uint64 // offset (data, end) or count (ack)
	data []byte
}

// readFrame reads one frame; buf (MaxFrame bytes) holds a data frame's bytes, which the
// next call overwrites.
func readFrame(r *bufio.Reader, buf []byte) (frame, error) {
	kind, err := r.ReadByte()
	if err != nil {
		return frame{}, err
	}
	var hdr [12]byte
	switch kind {
	case frameAck, frameFin:
		if _, err := io.ReadFull(r, hdr[:8]); err != nil {
			return frame{}, unexpected(err)
		}
		return frame{kind: kind, n: binary.BigEndian.Uint64(hdr[:8])}, nil
	case frameData:
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return frame{}, unexpected(err)
		}
		n := binary.BigEndian.Uint32(hdr[8:])
		if n == 0 || n > MaxFrame {
			return frame{}, fmt.Errorf("%w: data frame of %d bytes", errProtocol, n)
		}
		if _, err := io.ReadFull(r, buf[:n]); err != nil {
			return frame{}, unexpected(err)
		}
		return frame{kind: kind, n: binary.BigEndian.Uint64(hdr[:8]), data: buf[:n]}, nil
	}
	return frame{}, fmt.Errorf("%w: frame type %#x", errProtocol, kind)
}

func unexpected(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

func appendData(b []byte, off uint64, p []byte) []byte {
	b = append(b, frameData)
	b = binary.BigEndian.AppendUint64(b, off)
	b = binary.BigEndian.AppendUint32(b, uint32(len(p)))
	return append(b, p...)
}

func appendCount(b []byte, kind byte, n uint64) []byte {
	b = append(b, kind)
	return binary.BigEndian.AppendUint64(b, n)
}
