package provider

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
)

// DefaultMaxSSELine bounds one SSE line, and the data of one event, in
// bytes. A longer line is an error, never a silent truncation.
const DefaultMaxSSELine = 1 << 20

// errSSELineTooLong is wrapped by the decoder when a line or an event's data
// exceeds the bound.
var errSSELineTooLong = errors.New("SSE line exceeds the size limit")

// sseEvent is one dispatched server-sent event.
type sseEvent struct {
	Event string // the "event:" field, "" when absent
	Data  []byte // the "data:" lines joined by "\n"
}

// sseDecoder reads server-sent events (the subset /chat/completions uses):
// "data:" lines accumulate, a blank line dispatches, ":" lines are comments,
// "event:" names the event, other fields are ignored. Lines end in "\n" or
// "\r\n". At EOF an event without its blank line is dispatched only when its
// data is "[DONE]" (servers often omit the last blank line); anything else
// pending was cut short and is dropped, so the stream reads as incomplete.
type sseDecoder struct {
	sc      *bufio.Scanner
	max     int
	data    bytes.Buffer
	hasData bool
	event   string
}

func newSSEDecoder(r io.Reader, maxLine int) *sseDecoder {
	if maxLine <= 0 {
		maxLine = DefaultMaxSSELine
	}
	sc := bufio.NewScanner(r)
	// Scanner's limit counts the buffer, which holds the line and its "\r\n".
	sc.Buffer(make([]byte, 0, min(64<<10, maxLine+2)), maxLine+2)
	return &sseDecoder{sc: sc, max: maxLine}
}

// Next returns the next event, io.EOF at the end of the input, or an error.
func (d *sseDecoder) Next() (sseEvent, error) {
	for d.sc.Scan() {
		line := d.sc.Bytes()
		if len(line) > d.max {
			return sseEvent{}, fmt.Errorf("%w (%d bytes)", errSSELineTooLong, d.max)
		}
		if len(line) == 0 {
			if !d.hasData {
				d.event = ""
				continue
			}
			return d.dispatch(), nil
		}
		if line[0] == ':' {
			continue
		}
		field, value, _ := bytes.Cut(line, []byte(":"))
		value = bytes.TrimPrefix(value, []byte(" "))
		switch string(field) {
		case "data":
			if d.hasData {
				d.data.WriteByte('\n')
			}
			if d.data.Len()+len(value) > d.max {
				return sseEvent{}, fmt.Errorf("%w (event data over %d bytes)", errSSELineTooLong, d.max)
			}
			d.data.Write(value)
			d.hasData = true
		case "event":
			d.event = string(value)
		}
	}
	if err := d.sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return sseEvent{}, fmt.Errorf("%w (%d bytes)", errSSELineTooLong, d.max)
		}
		return sseEvent{}, err
	}
	if d.hasData && bytes.Equal(bytes.TrimSpace(d.data.Bytes()), []byte("[DONE]")) {
		return d.dispatch(), nil
	}
	return sseEvent{}, io.EOF
}

func (d *sseDecoder) dispatch() sseEvent {
	ev := sseEvent{Event: d.event, Data: bytes.Clone(d.data.Bytes())}
	d.data.Reset()
	d.hasData = false
	d.event = ""
	return ev
}
