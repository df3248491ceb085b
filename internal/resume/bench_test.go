package resume

import (
	"io"
	"net"
	"testing"
)

// BenchmarkRoundtrip: 200 bytes there and back between two goroutines over
// a Unix socket pair, raw (the baseline) and through a pair of streams
// attached over it, whose far side echoes as klbr-kernel --listen's child
// would:
//
//	go test -run '^$' -bench BenchmarkRoundtrip -benchtime 20000x -count 3 ./internal/resume/
func BenchmarkRoundtrip(b *testing.B) {
	msg := make([]byte, 200)
	b.Run("via=socket", func(b *testing.B) {
		x, y, err := socketPair()
		if err != nil {
			b.Fatal(err)
		}
		defer x.Close()
		defer y.Close()
		go io.Copy(y, y)
		buf := make([]byte, len(msg))
		for b.Loop() {
			if _, err := x.Write(msg); err != nil {
				b.Fatal(err)
			}
			if _, err := io.ReadFull(x, buf); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("via=stream", func(b *testing.B) {
		x, y, err := socketPair()
		if err != nil {
			b.Fatal(err)
		}
		srv, cli := New(Config{Listener: true}), New(Config{})
		go srv.Attach(x)
		go cli.Attach(y)
		defer srv.Close()
		defer cli.Close()
		go io.Copy(srv, srv)
		buf := make([]byte, len(msg))
		for b.Loop() {
			if _, err := cli.Write(msg); err != nil {
				b.Fatal(err)
			}
			if _, err := io.ReadFull(cli, buf); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func socketPair() (net.Conn, net.Conn, error) {
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: "", Net: "unix"})
	if err != nil {
		return nil, nil, err
	}
	defer l.Close()
	acc := make(chan net.Conn, 1)
	go func() {
		c, _ := l.Accept()
		acc <- c
	}()
	d, err := net.Dial("unix", l.Addr().String())
	if err != nil {
		return nil, nil, err
	}
	return d, <-acc, nil
}
