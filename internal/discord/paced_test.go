package discord

import (
	"bytes"
	"context"
	"errors"
	"io"
	"testing"
	"testing/synctest"
	"time"
)

// A paced fetch reads at its rate after the first burst, never more than a
// chunk at a time (the memory bound), and stops when its fetch is over.
func TestAPacedReadKeepsItsRateAndChunk(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const size, rate = 1 << 20, 256 << 10
		p := newPaced(context.Background(), bytes.NewReader(make([]byte, size)), rate)
		start := time.Now()
		buf := make([]byte, 1<<20)
		var got int
		for {
			n, err := p.Read(buf)
			if n > pacedChunk {
				t.Fatalf("a read of %d bytes, past the chunk (%d)", n, pacedChunk)
			}
			got += n
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		// The read that finds the end waits its turn too: all but the
		// burst at the rate.
		want := time.Duration(float64(size-pacedBurst) / rate * float64(time.Second))
		if el := time.Since(start); got != size || el < want || el > want+10*time.Millisecond {
			t.Fatalf("%d bytes in %s, want %d in %s", got, el, size, want)
		}
	})
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		p := newPaced(ctx, bytes.NewReader(make([]byte, 1<<20)), 64<<10)
		_, err := io.Copy(io.Discard, p)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("a paced read past its fetch's time ended with %v", err)
		}
	})
}
