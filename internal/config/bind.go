package config

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
)

// ErrNotLoopback is wrapped by CheckBindAddr's errors for addresses that are
// well formed but not loopback.
var ErrNotLoopback = errors.New("klbr serves only loopback")

// CheckBindAddr accepts a host:port the web UI and API may listen on: the
// host is an address in 127.0.0.0/8, ::1 (written [::1]) or "localhost", and
// the port is numeric (0 picks a free one). Anything else is refused, because
// klbr serves only loopback: the operator's UI must not be reachable from
// other machines.
func CheckBindAddr(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("bind address %q refused: want host:port with a loopback host, e.g. 127.0.0.1:8765: %w", addr, err)
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return fmt.Errorf("bind address %q refused: port %q is not a number in 0..65535", addr, port)
	}
	if strings.EqualFold(host, "localhost") {
		return nil
	}
	if ip, err := netip.ParseAddr(host); err == nil && ip.Zone() == "" && ip.IsLoopback() {
		return nil
	}
	return fmt.Errorf("bind address %q refused: %w (127.0.0.0/8, [::1] or localhost); reach it from elsewhere through an SSH tunnel or a reverse proxy", addr, ErrNotLoopback)
}
