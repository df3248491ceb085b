package provider

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

func TestStreamTotalBound(t *testing.T) {
	var in bytes.Buffer
	for i := 0; i < 100; i++ {
		in.WriteString(`data: {"choices":[{"index":0,"delta":{"content":"` + strings.Repeat("x", 50) + `"}}]}` + "\n\n")
	}
	in.WriteString("data: [DONE]\n\n")
	c := &Client{maxLine: DefaultMaxSSELine, maxBody: 1000}
	_, err := c.readStream(&in, nil)
	var e *Error
	if !errors.As(err, &e) || e.Kind != KindProtocol {
		t.Fatalf("%v", err)
	}
}
