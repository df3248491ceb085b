package kernel

import (
	"bytes"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestProtocolStdio: with --protocol-stdio the child reads the protocol from fd 3, which is
// the kernel's stdin itself, and writes it to fd KLBR_PROTOCOL_OUT_FD (4), the kernel's
// stdout itself: no copy in between (a hop of its own each way on a worker host). The
// child's prints never reach that stream, and the end of stdin is the end of the child's
// stream.
func TestProtocolStdio(t *testing.T) {
	py := python(t)
	script := `
import os, sys
out = int(os.environ["KLBR_PROTOCOL_OUT_FD"])
kinds = os.readlink("/proc/self/fd/3").split(":")[0] + "," + os.readlink("/proc/self/fd/%d" % out).split(":")[0]
print("a print of the cell", flush=True)
os.write(1, b"raw fd 1 write\n")
data = b""
while True:
    b = os.read(3, 4096)
    if not b:
        break
    data += b
os.write(out, b"echo:" + data + b" via " + kinds.encode())
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
	if got := stdout.String(); got != "echo:ping over the pipe via pipe,pipe" {
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
