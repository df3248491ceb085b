package daemon

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"

	"github.com/klbr-dev/klbr/internal/config"
	"github.com/klbr-dev/klbr/internal/systemd"
	"github.com/klbr-dev/klbr/internal/unixsock"
)

// The FileDescriptorName= of the sockets systemd may pass (nix/systemd/klbr-core*.socket).
const (
	socketHTTP    = "http"    // TCP on loopback: the browser UI, /healthz, /metrics
	socketControl = "control" // Unix: the operator API
	socketIngress = "ingress" // Unix: the ingress API klbr-discord talks to
)

// listeners are the sockets the daemon serves on: those systemd passed (socket activation),
// and for each one it did not pass, one bound here as configured. Only Run's goroutine uses
// it.
type listeners struct {
	http    []net.Listener
	control []net.Listener
	ingress []net.Listener

	inherited map[net.Listener]bool // passed by systemd
	// boundControl is the control socket path this process bound, removed at exit; empty when
	// systemd passed the control socket (it is systemd's file: never chmod, move or remove it).
	boundControl string
	boundIngress string // likewise for the ingress socket
}

// inheritListeners takes the sockets systemd passed and checks each: http must be a TCP
// socket on a loopback address, control and ingress Unix stream sockets; any other name is
// refused, so that a mistake in the socket units is an error at start, not a socket nobody
// serves.
func inheritListeners(log *slog.Logger) (*listeners, error) {
	socks, err := systemd.TakeSockets()
	if err != nil {
		return nil, fmt.Errorf("socket activation: %w", err)
	}
	ls := &listeners{
		http: socks.Take(socketHTTP), control: socks.Take(socketControl), ingress: socks.Take(socketIngress),
		inherited: map[net.Listener]bool{},
	}
	for _, l := range ls.all() {
		ls.inherited[l] = true
	}
	if rest := socks.Names(); len(rest) > 0 {
		socks.Close()
		ls.close()
		return nil, fmt.Errorf("socket activation: systemd passed sockets named %s; klbr-core serves only FileDescriptorName=%s, %s and %s",
			strings.Join(rest, ", "), socketHTTP, socketControl, socketIngress)
	}
	var errs []error
	for _, l := range ls.http {
		if err := checkLoopback(l.Addr()); err != nil {
			errs = append(errs, err)
		}
	}
	for _, group := range []struct {
		name string
		ls   []net.Listener
	}{{socketControl, ls.control}, {socketIngress, ls.ingress}} {
		for _, l := range group.ls {
			ul, ok := l.(*net.UnixListener)
			if !ok {
				errs = append(errs, fmt.Errorf("socket activation: the %s socket %s is not a Unix socket: use ListenStream=/path", group.name, l.Addr()))
				continue
			}
			ul.SetUnlinkOnClose(false)
		}
	}
	if len(ls.control) > 1 || len(ls.ingress) > 1 {
		errs = append(errs, fmt.Errorf("socket activation: %d control and %d ingress sockets passed; klbr-core serves one of each", len(ls.control), len(ls.ingress)))
	}
	if err := errors.Join(errs...); err != nil {
		ls.close()
		return nil, err
	}
	if len(ls.inherited) > 0 {
		log.Info("socket activation", "http", addrs(ls.http), "control", addrs(ls.control), "ingress", addrs(ls.ingress))
	}
	return ls, nil
}

// checkLoopback refuses an inherited http socket that is not TCP on a loopback address:
// klbr serves its UI to this machine only, whoever wrote the socket unit.
func checkLoopback(a net.Addr) error {
	ta, ok := a.(*net.TCPAddr)
	if !ok {
		return fmt.Errorf("socket activation: the http socket %s (%s) is not a TCP socket: use ListenStream=127.0.0.1:8765", a, a.Network())
	}
	if !ta.IP.IsLoopback() {
		return fmt.Errorf("socket activation: the http socket %s refused: %w (127.0.0.0/8 or [::1]); set ListenStream=127.0.0.1:8765 in klbr-core.socket and reach it from elsewhere through an SSH tunnel or a reverse proxy",
			a, config.ErrNotLoopback)
	}
	return nil
}

// bindMissing binds what systemd did not pass: the control socket at its configured path
// (mode 0600), the ingress socket at its configured path (mode 0660: klbr-discord may run
// as another user in the socket's group) and the HTTP listener at KLBR_BIND_ADDR, as
// klbr-core does when run by hand. The caller holds the data directory lock, which makes
// removing a stale socket safe.
func (ls *listeners) bindMissing(cfg *config.Config, log *slog.Logger) error {
	if len(ls.ingress) == 0 {
		l, err := unixsock.Listen(cfg.Paths.IngressSocket, 0o660)
		if err != nil {
			return fmt.Errorf("ingress socket: %w", err)
		}
		ls.ingress, ls.boundIngress = []net.Listener{l}, cfg.Paths.IngressSocket
	}
	if len(ls.control) == 0 {
		l, err := unixsock.Listen(cfg.Paths.ControlSocket, 0o600)
		if err != nil {
			return fmt.Errorf("control socket: %w", err)
		}
		ls.control, ls.boundControl = []net.Listener{l}, cfg.Paths.ControlSocket
	} else if got := ls.control[0].Addr().String(); got != cfg.Paths.ControlSocket {
		log.Warn("the control socket systemd passed is not where the CLI looks; set KLBR_CONTROL_SOCKET to it for klbr-core's service and shell",
			"socket", got, "KLBR_CONTROL_SOCKET", cfg.Paths.ControlSocket)
	}
	if len(ls.http) == 0 {
		l, err := net.Listen("tcp", loopbackLiteral(cfg.BindAddr))
		if err != nil {
			return fmt.Errorf("%w (is another klbr-core or program using it? set KLBR_BIND_ADDR)", err)
		}
		// Whatever the address said, the socket bound must be on loopback.
		if err := checkLoopback(l.Addr()); err != nil {
			l.Close()
			return fmt.Errorf("KLBR_BIND_ADDR %s: %w", cfg.BindAddr, err)
		}
		ls.http = []net.Listener{l}
	}
	return nil
}

// loopbackLiteral replaces the host "localhost" by 127.0.0.1: the resolver (a hosts file,
// NSS) may say localhost is any address, and klbr binds loopback only.
func loopbackLiteral(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || !strings.EqualFold(strings.TrimSuffix(host, "."), "localhost") {
		return addr
	}
	return net.JoinHostPort("127.0.0.1", port)
}

// activated reports whether any listener came from systemd.
func (ls *listeners) activated() bool { return len(ls.inherited) > 0 }

// stopAccepting closes the listeners systemd passed, at the start of a drain: connections
// that arrive from now on wait in systemd's socket for the next daemon instead of being
// answered "draining" by this one (systemd holds its own copy of each socket, so closing
// ours neither unlinks nor stops listening). Connections already accepted are served to
// the end of the drain. Listeners bound here stay open and answer "draining" until exit, as
// when klbr-core runs by hand.
func (ls *listeners) stopAccepting() {
	for l := range ls.inherited {
		l.Close()
	}
}

// close closes every listener and removes the control socket this process bound.
func (ls *listeners) close() {
	for _, l := range ls.all() {
		l.Close()
	}
	if ls.boundControl != "" {
		os.Remove(ls.boundControl)
	}
	if ls.boundIngress != "" {
		os.Remove(ls.boundIngress)
	}
}

func (ls *listeners) all() []net.Listener {
	return append(append(append([]net.Listener(nil), ls.http...), ls.control...), ls.ingress...)
}

func addrs(ls []net.Listener) string {
	s := make([]string, len(ls))
	for i, l := range ls {
		s[i] = l.Addr().String()
	}
	return strings.Join(s, " ")
}
