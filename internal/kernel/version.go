package kernel

import (
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/klbr-dev/klbr/internal/version"
)

// Protocol is the version of the contract above (the command line, the
// go-ahead byte, the protocol fd as fd 3, the exit statuses). A klbr-core
// reaching a worker host runs that host's klbr-kernel only when the host's
// says the same number; a change that an older core or kernel would
// misread raises it. 2: under --protocol-stdio the child reads fd 3 and writes fd 4
// (KLBR_PROTOCOL_OUT_FD), the kernel's own stdin and stdout, where 1 gave it one socket.
// 3: --listen SOCK --grace D and --attach SOCK (a resumable protocol stream, which a
// klbr-core of protocol 3 uses for every worker on a host).
const Protocol = 3

// versionArg makes klbr-kernel print its version line and exit.
const versionArg = "--version"

// attachArg is the relay mode: klbr-kernel --attach PATH (see attach).
const attachArg = "--attach"

// VersionLine is what `klbr-kernel --version` prints:
// "klbr-kernel VERSION protocol N".
func VersionLine() string {
	return fmt.Sprintf("klbr-kernel %s protocol %d", version.Version, Protocol)
}

func printVersion(w io.Writer) int {
	fmt.Fprintln(w, VersionLine())
	return 0
}

// ParseVersionLine reads a version line: the build's version and its
// protocol; ok is false for anything else (an old kernel without
// --version, or another program of that name).
func ParseVersionLine(line string) (ver string, protocol int, ok bool) {
	f := strings.Fields(line)
	if len(f) != 4 || f[0] != "klbr-kernel" || f[2] != "protocol" || len(f[1]) > 100 {
		return "", 0, false
	}
	p, err := strconv.Atoi(f[3])
	if err != nil || p < 1 {
		return "", 0, false
	}
	return f[1], p, true
}
