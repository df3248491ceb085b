package kernel

import (
	"bytes"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestProtocolStdio: with --protocol-stdio the child's fd 3 is a socket whose bytes are the
// kernel's stdin and stdout, the child's prints never reach that stream, and the end of
// stdin is the end of the child's stream.
func TestProtocolStdio(t *testing.T) {
	py := python(t)
	script := `
import os, socket, sys
s = socket.socket(fileno=3)
print("a print of the cell", flush=True)
os.write(1, b"raw fd 1 write\n")
data = b""
while True:
    b = s.recv(4096)
    if not b:
        break
    data += b
s.sendall(b"echo:" + data)
`
	cmd := exec.Command(kernelBin, "--protocol-stdio", "--", py, "-c", script)
	cmd.Stdin = strings.NewReader("ping over the pipe")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	done := make(chan error, 1)
	go func() { done <- cmd.Run() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("%v; stderr: %s", err, stderr.String())
		}
	case <-time.After(20 * time.Second):
		cmd.Process.Kill()
		t.Fatal("the kernel did not end after its stdin ended")
	}
	if got := stdout.String(); got != "echo:ping over the pipe" {
		t.Fatalf("protocol stream (stdout) = %q, want only the child's socket bytes", got)
	}
	if !strings.Contains(stderr.String(), "a print of the cell") || !strings.Contains(stderr.String(), "raw fd 1 write") {
		t.Fatalf("the child's stdout should go to stderr; stderr = %q", stderr.String())
	}
}

func TestProtocolStdioExcludesProtocolFD(t *testing.T) {
	if _, err := ParseArgs([]string{"--protocol-stdio", "--protocol-fd", "3", "--", "x"}); err == nil {
		t.Fatal("--protocol-stdio with --protocol-fd accepted")
	}
}
