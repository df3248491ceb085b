package systemd

import (
	"context"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
)

// Notifier tells systemd what the daemon is doing, over NOTIFY_SOCKET (sd_notify). Made
// without NOTIFY_SOCKET, or as a zero value, it does nothing. It is safe for concurrent use.
type Notifier struct {
	enabled bool
	log     *slog.Logger

	mu     sync.Mutex // guards status and failed
	status string     // the last STATUS= sent, so that repeats are skipped
	failed bool       // a send failed and was logged; later failures are not
}

// NewNotifier returns a Notifier for NOTIFY_SOCKET as the process found it. log receives the
// first failure to notify (later ones are not logged); nil logs nothing.
func NewNotifier(log *slog.Logger) *Notifier {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Notifier{enabled: os.Getenv("NOTIFY_SOCKET") != "", log: log}
}

// Enabled reports whether a service manager listens.
func (n *Notifier) Enabled() bool { return n != nil && n.enabled }

// Ready sends READY=1 with a status line: the daemon serves.
func (n *Notifier) Ready(status string) { n.send("READY=1", status) }

// Status sends a status line, unless it is the one sent last.
func (n *Notifier) Status(status string) { n.send("", status) }

// Stopping sends STOPPING=1 with a status line: the drain has begun.
func (n *Notifier) Stopping(status string) { n.send("STOPPING=1", status) }

// ExtendTimeout asks systemd to wait d more for the current state (here: stopping) to end,
// with a status line. systemd honours it only past TimeoutStopSec=, and only while the
// daemon keeps sending it.
func (n *Notifier) ExtendTimeout(d time.Duration, status string) {
	n.send("EXTEND_TIMEOUT_USEC="+strconv.FormatInt(d.Microseconds(), 10), status)
}

// send sends state and, if set and new, STATUS=status, as one datagram.
func (n *Notifier) send(state, status string) {
	if !n.Enabled() {
		return
	}
	status = strings.Join(strings.Fields(status), " ") // one line
	var lines []string
	if state != "" {
		lines = append(lines, state)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if status != "" && (status != n.status || state != "") {
		lines = append(lines, "STATUS="+status)
	}
	if len(lines) == 0 {
		return
	}
	// The lock also keeps the datagrams in the order their callers sent them.
	_, err := daemon.SdNotify(false, strings.Join(lines, "\n"))
	if err != nil {
		if !n.failed {
			n.failed = true
			n.log.Warn("cannot notify systemd; further failures are not logged", "error", err, "state", lines[0])
		}
		return
	}
	if status != "" {
		n.status = status
	}
}

// StartWatchdog pings WATCHDOG=1 at half the interval systemd asked for (WATCHDOG_USEC, when
// WATCHDOG_PID is unset or names this process) until ctx ends or stop is called. A ping is
// sent only when alive returns nil within a quarter of the interval, so a daemon whose store
// does not answer stops pinging and systemd restarts it; alive may be nil. Without a watchdog
// (or without a service manager) it starts nothing. stop waits for the pinger to end; calling
// it more than once is safe.
func (n *Notifier) StartWatchdog(ctx context.Context, alive func(context.Context) error) (stop func()) {
	if !n.Enabled() {
		return func() {}
	}
	interval, err := daemon.SdWatchdogEnabled(false)
	if err != nil {
		n.log.Warn("ignoring the watchdog systemd asked for", "error", err)
		return func() {}
	}
	if interval <= 0 {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { n.watchdog(ctx, interval, alive) })
	return func() { cancel(); wg.Wait() }
}

func (n *Notifier) watchdog(ctx context.Context, interval time.Duration, alive func(context.Context) error) {
	every := interval / 2
	t := time.NewTimer(0) // the first ping at once: READY=1 has just been sent
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := check(ctx, interval/4, alive); err != nil {
			if ctx.Err() != nil {
				return
			}
			n.log.Error("watchdog: the daemon does not answer; not pinging systemd", "error", err)
		} else {
			n.send("WATCHDOG=1", "")
		}
		t.Reset(every)
	}
}

func check(ctx context.Context, timeout time.Duration, alive func(context.Context) error) error {
	if alive == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return alive(ctx)
}

// KeepExtending sends EXTEND_TIMEOUT_USEC= with the line status returns now and every period
// until stop is called; each message grants three periods, so that systemd's stop timeout
// takes over soon after a daemon stops reporting. stop waits for the sender to end; calling
// it more than once is safe. Without a service manager it starts nothing.
func (n *Notifier) KeepExtending(period time.Duration, status func() string) (stop func()) {
	if !n.Enabled() {
		return func() {}
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTimer(0)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			n.ExtendTimeout(3*period, status())
			t.Reset(period)
		}
	})
	return func() { cancel(); wg.Wait() }
}
