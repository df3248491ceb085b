// Package daemon wires klbr-core serve: it opens the store, builds the
// domain parts, serves the operator API and the HTTP listener, and drains in
// order when asked to stop.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/klbr-dev/klbr/internal/activation"
	"github.com/klbr-dev/klbr/internal/admission"
	"github.com/klbr-dev/klbr/internal/agents"
	"github.com/klbr-dev/klbr/internal/api"
	"github.com/klbr-dev/klbr/internal/artifacts"
	"github.com/klbr-dev/klbr/internal/behavior"
	"github.com/klbr-dev/klbr/internal/config"
	"github.com/klbr-dev/klbr/internal/diskuse"
	"github.com/klbr-dev/klbr/internal/history"
	"github.com/klbr-dev/klbr/internal/hooks"
	"github.com/klbr-dev/klbr/internal/hosts"
	"github.com/klbr-dev/klbr/internal/httpguard"
	"github.com/klbr-dev/klbr/internal/ingress"
	"github.com/klbr-dev/klbr/internal/jobs"
	"github.com/klbr-dev/klbr/internal/live"
	"github.com/klbr-dev/klbr/internal/localapi"
	"github.com/klbr-dev/klbr/internal/metrics"
	"github.com/klbr-dev/klbr/internal/observe"
	"github.com/klbr-dev/klbr/internal/placement"
	"github.com/klbr-dev/klbr/internal/provider"
	"github.com/klbr-dev/klbr/internal/pyenv"
	"github.com/klbr-dev/klbr/internal/session"
	"github.com/klbr-dev/klbr/internal/setup"
	"github.com/klbr-dev/klbr/internal/spend"
	"github.com/klbr-dev/klbr/internal/store"
	"github.com/klbr-dev/klbr/internal/systemd"
	"github.com/klbr-dev/klbr/internal/telemetry"
	"github.com/klbr-dev/klbr/internal/turn"
	"github.com/klbr-dev/klbr/internal/unixsock"
	"github.com/klbr-dev/klbr/internal/version"
	"github.com/klbr-dev/klbr/internal/web"
	"github.com/klbr-dev/klbr/internal/workbench"
)

// Options tune Run beyond the configuration.
type Options struct {
	// Ready is called once the listeners are bound and the store is migrated.
	Ready func(Addrs)
	// DrainTimeout bounds the wait for accepted work at shutdown; 0 means 60s.
	DrainTimeout time.Duration
	Clock        func() time.Time
	// After, with Clock, is the timer of waits that end at a time of
	// Clock's: a spend cap's period end (nil: time.After).
	After func(time.Duration) <-chan time.Time
	// StopNow, when it yields or closes during a drain (a second Ctrl-C),
	// ends the wait for accepted work: running cells are interrupted and
	// recorded as such, admitted inputs stay pending for the next start.
	StopNow <-chan struct{}
	// Hangup, if set, carries SIGHUP: each one rereads klbr.toml as
	// klbr-core reload does (serve passes signal.Notify's channel).
	Hangup <-chan os.Signal
}

// Addrs are where a running daemon listens.
type Addrs struct {
	HTTP    string // host:port
	Control string // socket path
}

// daemon is one run of klbr-core serve.
type daemon struct {
	cfg     *config.Config // as at the start: its Paths and BindAddr never change; the file in force is file
	metrics *metrics.Metrics

	// reloadMu serializes reloads (Reload) and guards file: the klbr.toml
	// in force. The parts it changes guard their own state (the router's
	// table, the turn loop's Live, the meter's caps).
	reloadMu sync.Mutex
	file     config.File

	log      *slog.Logger
	clock    func() time.Time
	after    func(time.Duration) <-chan time.Time // nil: time.After
	started  time.Time
	store    *store.Store
	sessions *session.Manager
	// tracer exports traces ([telemetry] otlp_endpoint); nil when off.
	tracer   *telemetry.Tracer
	admit    *admission.Admitter
	bench    *workbench.Manager // nil when cells cannot run
	benchErr error
	placer   placement.Placer
	hooks    *hooks.Dispatcher // nil when cells cannot run
	behavior *activation.Service
	envs     pyenv.Envs // where releases' dependency environments are staged

	indexMu  sync.Mutex // guards indexKey, index: the last skill index of the contract message
	indexKey string
	index    string
	releases *behavior.Releases
	deltas   *live.Hub // token deltas of model steps, best-effort
	// turns, routes and meter are nil until the agent runs: set once,
	// at the start or at the reload that first gives it a route (startTurns),
	// never unset. Read them through turnLoop, routeTable and spendMeter.
	turns  atomic.Pointer[turn.Loop]       // the sessions' turn loop
	routes atomic.Pointer[provider.Router] // the turns' routes
	meter  atomic.Pointer[spend.Meter]     // spend caps and reservations
	// agentFile is the klbr.toml the agent started with (reloadMu).
	agentFile config.File
	jobs      *jobs.Manager  // nil when cells cannot run
	hosts     *hosts.Engine  // the worker hosts; nil when klbr.toml has none
	agents    *agents.Agents // child agents; nil when cells cannot run
	// observers runs the durable observers (nil when cells cannot run).
	observers *observe.Runner
	agentMu   sync.Mutex // guards agent, inForce
	agent     string     // whether the agent runs and on which route, for status (agentState)
	inForce   api.ConfigInForce

	ingress *ingress.Server // the ingress API (klbr-discord)

	notify       *systemd.Notifier // no-op without NOTIFY_SOCKET
	cellsRunning atomic.Int64      // cells running through the operator API, for STATUS=
	statusPoke   chan struct{}     // buffered(1): the STATUS= line may have changed

	shutdownOnce sync.Once
	shutdown     chan struct{} // closed when a drain or stop is requested
	stop         bool          // set before shutdown closes: interrupt instead of await
	closing      chan struct{} // closed when the drain begins

	disk *diskuse.Meter // the data directory against [storage] max_bytes
	gc   gcRunner
}

// Run serves until ctx ends (SIGTERM) or an operator asks for a drain or
// stop, then drains in order and returns nil. Errors before serving (not
// initialized, data directory held, port taken, a socket from systemd that
// is not what klbr-core serves) are returned as they are.
//
// Under systemd it serves the sockets systemd passes (by FileDescriptorName:
// http, control, ingress) and binds the others itself; it sends READY=1 once
// its listeners are bound, the store is migrated and placement and behavior
// are ready, keeps STATUS= current, pings the watchdog, and sends STOPPING=1
// and EXTEND_TIMEOUT_USEC= while it drains (package systemd).
func Run(ctx context.Context, cfg *config.Config, log *slog.Logger, opts Options) error {
	if opts.Clock == nil {
		opts.Clock = time.Now
	}
	if opts.DrainTimeout <= 0 {
		opts.DrainTimeout = 60 * time.Second
	}
	dir := cfg.Paths.DataDir
	if !setup.Initialized(dir) {
		return fmt.Errorf("serve: %s is not initialized; run `klbr-core init` first", dir)
	}
	if err := config.CheckBindAddr(cfg.BindAddr); err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	notify := systemd.NewNotifier(log.With("component", "systemd"))
	ls, err := inheritListeners(log)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	defer ls.close()
	notify.Status("starting: opening the store")
	st, err := store.Open(ctx, dir, store.Options{Clock: opts.Clock, Logger: log.With("component", "store")})
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	defer st.Close()
	var recovered int64
	if err := st.Write(ctx, func(tx *store.Tx) (err error) {
		recovered, err = tx.RecoverClaims()
		return err
	}); err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	if recovered > 0 {
		log.Info("returned inputs claimed by a previous run to pending", "inputs", recovered)
	}

	d := &daemon{
		cfg: cfg, log: log, clock: opts.Clock, after: opts.After, started: opts.Clock(), store: st,
		sessions: session.NewManager(st),
		shutdown: make(chan struct{}), closing: make(chan struct{}),
		notify: notify, statusPoke: make(chan struct{}, 1),
		deltas: live.NewHub(), file: cfg.File,
		inForce: api.ConfigInForce{Path: cfg.Paths.ConfigFile, Digest: cfg.Digest, ReadAt: opts.Clock()},
		disk:    diskuse.New(dir, cfg.File.Storage.MaxBytes, cfg.File.Storage.Resolved().WarnAt),
	}
	m := metrics.New(st, opts.Clock, log.With("component", "metrics"))
	d.metrics = m
	m.WatchStorageBound(d.disk.Usage)
	d.admit = admission.New(st, d.sessions, opts.Clock, m.ObserveAdmission)
	d.ingress = newIngress(d, m.Registerer(), log.With("component", "ingress"))
	if err := st.Write(ctx, func(tx *store.Tx) error {
		n, err := tx.RecoverExecutions()
		if n > 0 {
			log.Warn("cells of a previous run were left running; recorded as lost, not replayed", "cells", n)
		}
		return err
	}); err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	stopStorage := d.watchStorage(ctx)
	defer stopStorage()
	resume, err := d.recoverTurns(ctx)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	notify.Status("starting: detecting placement and the workbench")
	if err := d.startHosts(cfg, m); err != nil {
		return fmt.Errorf("serve: hosts: %w", err)
	}
	if d.hosts != nil {
		defer d.hosts.Close() // after the jobs (defers run last first)
	}
	remote, err := d.remoteWorkbench(cfg)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	d.bench, d.placer, d.benchErr = newWorkbench(ctx, cfg, st, d.sessions, d.disk, log, remote, d.hosts, func(e string) { m.WorkerEvent("workbench", e) })
	if d.bench != nil {
		// Workbenches on hosts that outlived a killed predecessor are taken
		// back (in the background, each session's turn held until then).
		if err := d.bench.ReattachRemote(ctx); err != nil {
			log.Warn("workbenches on hosts are not reattached", "error", err)
		}
	}
	stopBound := d.watchBound(ctx)
	defer stopBound()
	mode := ""
	if d.placer != nil {
		mode = string(d.placer.Mode())
	}
	m.SetPlacement(mode)
	if d.benchErr != nil {
		log.Warn("cells cannot run; serving without a workbench", "error", d.benchErr)
	} else if err := d.bootBehavior(ctx, cfg, m); err != nil {
		return fmt.Errorf("serve: behavior: %w", err)
	}
	if err := d.startJobs(ctx, cfg, m); err != nil {
		return fmt.Errorf("serve: jobs: %w", err)
	}
	if d.jobs != nil {
		defer d.jobs.Close()
	}
	d.agents = d.newAgents(cfg)
	if d.agents != nil {
		go d.agents.Run() // ends children past their wall time
		defer d.agents.Close()
	}
	if err := d.startTurns(ctx, cfg, m, resume); err != nil {
		return fmt.Errorf("serve: agent: %w", err)
	}
	if err := d.startObservers(ctx, m); err != nil {
		return fmt.Errorf("serve: observers: %w", err)
	}
	if d.observers != nil {
		defer d.observers.Close()
	}
	defer func() {
		if l := d.turnLoop(); l != nil { // started now or at a reload
			l.Close()
		}
	}()

	if err := ls.bindMissing(cfg, log); err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	ctl := localapi.New(st, d.admit, d.sessions, d, log.With("component", "localapi")).WithHistory(d.history(cfg), d.compact).WithGC(d).
		WithOutbox(d.ingress.Kick)
	if loc, err := cfg.File.Spend.Location(); err == nil {
		ctl.WithSpend(spendAPI{d: d, loc: loc})
	}
	if d.bench != nil {
		ctl.WithWorkbench(d.countCells(d.bench), nil).WithBehavior(d.behavior, d.releases)
		if d.jobs != nil {
			ctl.WithJobs(d.jobs)
		}
		if d.observers != nil {
			ctl.WithReplay(d.replay)
		}
	} else {
		ctl.WithWorkbench(nil, d.benchErr)
	}
	ctl.WithReload(d.Reload)
	if d.hosts != nil {
		ctl.WithHosts(d.hosts)
	}
	ctlSrv := ctl.HTTPServer()
	if d.bench != nil {
		d.bench.SetOps("history.", history.NewOps(d.history(cfg)))
		d.spendOps(cfg)
	}
	token, err := setup.ReadToken(setup.TokenFile(dir))
	if err != nil {
		return fmt.Errorf("serve: operator token (run klbr-core init): %w", err)
	}
	var tokenMu sync.Mutex // token changes with `klbr-core open --rotate`
	ctl.WithBrowser(func() string {
		tokenMu.Lock()
		defer tokenMu.Unlock()
		return "http://" + ls.http[0].Addr().String() + "/?token=" + url.QueryEscape(token)
	})
	wb := web.Browser{Store: st, Admit: d.admit, Sessions: d.sessions, Daemon: d, Token: token, Deltas: d.deltas, Outbox: d.ingress.Kick,
		CookieMaxAge: cfg.File.Browser.CookieMaxAge(), History: d.history(cfg), TraceURL: cfg.File.Telemetry.TraceURL,
		Compact: func(ctx context.Context, session string) (api.Compacted, error) {
			res, err := d.compact(ctx, session)
			return api.NewCompacted(session, res), err
		}}
	if loc, err := cfg.File.Spend.Location(); err == nil {
		wb.Spend = spendAPI{d: d, loc: loc}
	}
	if d.bench != nil {
		wb.Workbench = d.bench
	}
	if d.jobs != nil {
		wb.Jobs = d.jobs
	}
	if d.behavior != nil {
		wb.Behavior, wb.Releases = d.behavior, d.releases
	}
	if arts, err := artifacts.New(filepath.Join(cfg.Paths.DataDir, "artifacts")); err == nil {
		wb.Artifacts = arts
	} else {
		log.Warn("the browser cannot serve artifacts", "error", err)
	}
	webH, err := web.New(d, m.Handler(), log.With("component", "web")).WithBrowser(wb)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	ctl.WithTokenRotation(func() error {
		tokenMu.Lock()
		defer tokenMu.Unlock()
		tok, err := setup.RotateToken(setup.TokenFile(dir))
		if err != nil {
			return err
		}
		token = tok
		return webH.RotateToken(tok)
	})
	webSrv := webH.HTTPServer()
	ingSrv := d.ingress.HTTPServer()

	serveErr := make(chan error, len(ls.all()))
	var wg sync.WaitGroup
	for _, s := range []struct {
		srv  *http.Server
		ls   []net.Listener
		unix bool
	}{{ctlSrv, ls.control, true}, {webSrv, ls.http, false}, {ingSrv, ls.ingress, true}} {
		for _, l := range s.ls {
			// Workers are turned away before they take a slot of the Unix sockets; each
			// listener holds its own bound of open connections: an idle flood on the TCP
			// port (or from a cell) cannot take the descriptors status, stop and drain need.
			// The TCP port's gate also keeps places for the operator's browser that
			// connections without the token cannot take (httpguard.Gate).
			if s.unix {
				l = unixsock.LimitListener(unixsock.FilterWorkers(l, placement.WorkerOf), httpguard.Limits{}.Conns())
			} else {
				l = webH.Listener(l)
			}
			wg.Go(func() { d.serve(s.srv, l, serveErr) })
		}
	}
	addrs := Addrs{HTTP: ls.http[0].Addr().String(), Control: ls.control[0].Addr().String()}
	log.Info("serving", "url", "http://"+addrs.HTTP+"/", "control_socket", addrs.Control, "data_dir", dir,
		"sqlite", st.Info().Version, "version", version.Version, "socket_activated", ls.activated())
	if opts.Ready != nil {
		opts.Ready(addrs)
	}
	notify.Ready(d.serveStatus(ctx))
	stopWatchdog := notify.StartWatchdog(ctx, d.alive)
	stopStatus := d.startStatus(ctx)

	var cause error
wait:
	for {
		select {
		case <-ctx.Done():
			log.Info("signal received: draining: no new work is accepted, accepted work finishes (at most "+
				opts.DrainTimeout.String()+"); Ctrl-C again stops now", "drain_timeout", opts.DrainTimeout)
		case <-d.shutdown:
		case cause = <-serveErr:
			log.Error("a listener failed: draining", "error", cause)
		case <-opts.Hangup:
			log.Info("SIGHUP: rereading klbr.toml")
			d.reloadFromSignal(ctx)
			continue
		}
		break wait
	}
	stopStatus()
	stopWatchdog() // systemd stops watching once it has STOPPING=1
	d.drain(opts.DrainTimeout, opts.StopNow, ls, ctlSrv, webSrv, ingSrv)
	wg.Wait()
	if cause != nil {
		return fmt.Errorf("serve: %w", cause)
	}
	return nil
}

// serve serves srv on l until the server shuts down, or, for a listener
// systemd passed, until the drain closes it; any other end is sent to failed.
func (d *daemon) serve(srv *http.Server, l net.Listener, failed chan<- error) {
	err := srv.Serve(l)
	if err == nil || errors.Is(err, http.ErrServerClosed) {
		return
	}
	select {
	case <-d.closing:
		if errors.Is(err, net.ErrClosed) {
			return // stopAccepting
		}
	default:
	}
	failed <- err
}

// drain closes admission, lets accepted work finish and record its outcome,
// closes the listeners and leaves closing the store to Run. Sockets systemd
// passed stop accepting first, so that new connections wait for the next
// daemon; systemd hears STOPPING=1, then EXTEND_TIMEOUT_USEC= for as long as
// accepted work is awaited.
func (d *daemon) drain(timeout time.Duration, stopNow <-chan struct{}, ls *listeners, servers ...*http.Server) {
	close(d.closing)
	// A reload in progress finishes first (one that starts the agent
	// publishes its turn loop, closed below); later ones see closing.
	d.reloadMu.Lock()
	d.reloadMu.Unlock() //nolint:staticcheck // an empty critical section: a barrier
	d.notify.Stopping(d.drainStatus())
	ls.stopAccepting()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	start := d.clock()
	stopExtending := d.notify.KeepExtending(extendEvery, d.drainStatus)
	defer stopExtending()
	if err := d.admit.Close(ctx); err != nil {
		d.log.Error("drain: admissions in flight did not finish", "error", err)
	}
	if d.stop && d.bench != nil {
		d.log.Info("stop: interrupting running cells")
		d.bench.InterruptAll()
	}
	if err := d.awaitAccepted(ctx, stopNow); err != nil {
		d.log.Error("drain: accepted work did not finish in time", "error", err, "timeout", timeout)
	}
	stopExtending()
	d.notify.Status("draining: stopping workers")
	if l := d.turnLoop(); l != nil {
		l.Close() // a model request in flight is cut off and recorded as interrupted
	}
	if d.jobs != nil {
		d.jobs.Close() // every local job's tree is killed (the next start reconciles them by policy); a job on a worker host runs on and is reattached at the next start
	}
	if d.bench != nil {
		d.bench.Close() // a workbench on a worker host is a unit that outlives its connection: its stop goes over the host's connection, so before that closes
	}
	if d.hosts != nil {
		d.hosts.Close() // the SSH connections; units of jobs run on under their hosts' systemd
	}
	if d.observers != nil {
		d.observers.Close() // a delivery in flight stays pending: retried at the next start
	}
	if d.tracer != nil {
		if err := d.tracer.Close(ctx); err != nil { // the last spans are flushed
			d.log.Warn("drain: traces not exported", "error", err)
		}
	}
	if d.hooks != nil {
		d.hooks.Close()
	}
	d.notify.Status("draining: closing connections")
	d.ingress.Close() // ends the transport's waiting claims
	for _, s := range servers {
		// A listener systemd passed was closed at the drain's start
		// (stopAccepting); Shutdown may still find it tracked, if its Serve
		// has not returned yet, and close it again: that is no fault.
		if err := s.Shutdown(ctx); err != nil && !errors.Is(err, net.ErrClosed) {
			d.log.Warn("drain: listener did not close cleanly", "error", err)
			s.Close()
		}
	}
	d.log.Info("drained", "took", d.clock().Sub(start).Round(time.Millisecond))
}

// Shutdown implements localapi.Daemon.
func (d *daemon) Shutdown(stop bool) {
	d.shutdownOnce.Do(func() {
		d.stop = stop
		close(d.shutdown)
	})
}

// Closing implements localapi.Daemon.
func (d *daemon) Closing() <-chan struct{} { return d.closing }

// Draining implements web.Health.
func (d *daemon) Draining() bool { return d.admit.Draining() }

// Status implements localapi.Daemon.
func (d *daemon) Status(ctx context.Context) (api.Status, error) {
	sessions, err := d.store.Sessions(ctx)
	if err != nil {
		return api.Status{}, err
	}
	pending, err := d.store.PendingStats(ctx)
	if err != nil {
		return api.Status{}, err
	}
	bySession := map[string]int64{}
	for _, p := range pending {
		bySession[p.Session] += p.Count
	}
	st := api.Status{
		Version: version.Version, PID: os.Getpid(), StartedAt: d.started, DataDir: d.cfg.Paths.DataDir,
		Draining: d.admit.Draining(), SQLite: d.store.Info().Version,
		Placement: "none",
		Workbench: "ready",
		Agent:     d.agentState(),
		Config:    d.configInForce(),
		Sessions:  make([]api.SessionStatus, 0, len(sessions)),
	}
	if d.placer != nil {
		st.Placement = string(d.placer.Mode())
		for _, sk := range d.placer.Skipped() {
			st.PlacementNotes = append(st.PlacementNotes, sk.String())
		}
	}
	if d.benchErr != nil {
		st.Workbench = "unavailable: " + d.benchErr.Error()
	} else if d.bench != nil {
		st.Sandbox, st.SandboxDetail = d.bench.Config().SandboxBrief, d.bench.Config().SandboxSummary
		st.WorkbenchHost = d.bench.RemoteHost()
		st.WorkbenchLost = d.bench.RemoteLost()
	}
	st.Storage = d.store.Fault()
	if d.routeTable() != nil {
		rest := d.routeTable().Resting()
		for _, name := range slices.Sorted(maps.Keys(rest)) {
			st.Routes = append(st.Routes, api.RouteStatus{Name: name, RestingSeconds: rest[name]})
		}
	}
	if d.spendMeter() != nil {
		ms := d.spendMeter().State()
		st.Spend = &ms
		if st.PromptCache, err = d.promptCache(ctx); err != nil {
			return api.Status{}, err
		}
	}
	st.Jobs = d.jobsStatus()
	if st.Held, err = d.store.HeldCount(ctx); err != nil {
		return api.Status{}, err
	}
	if at, ok, err := d.store.HeldOldest(ctx); err != nil {
		return api.Status{}, err
	} else if ok {
		st.HeldSince = &at
	}
	st.Sizes = d.store.Sizes()
	st.Usage = d.disk.Usage()
	if st.Schema, err = d.store.Schema(ctx); err != nil {
		return api.Status{}, err
	}
	for _, s := range sessions {
		turn, err := d.store.Turn(ctx, s.ID)
		if err != nil {
			return api.Status{}, err
		}
		cs, err := d.store.ContextStats(ctx, s.ID)
		if err != nil {
			return api.Status{}, err
		}
		ss := api.SessionStatus{Session: s, Pending: bySession[s.ID], Draining: d.sessions.Draining(s.ID), TurnStatus: turn,
			Context: &api.ContextStatus{ContextStats: cs}}
		if l := d.turnLoop(); l != nil {
			ss.Retry = l.Retry(s.ID)
			if h := d.spendHold(s.ID); h != nil {
				ss.Retry = h
			}
			if st, ok := l.ContextState(s.ID); ok {
				ss.Context.ContextState = &st
			}
		}
		st.Sessions = append(st.Sessions, ss)
	}
	if d.hooks != nil {
		obs, err := d.store.ObserverStats(ctx)
		if err != nil {
			return api.Status{}, err
		}
		st.Hooks = &api.HooksStatus{Slots: d.hooks.Stats(), Observers: obs}
		if d.observers != nil {
			l := d.observers.Limits()
			st.Hooks.Limits = api.LoopLimits{MaxDepth: l.MaxDepth, Quota: l.Quota, WindowSeconds: l.Window.Seconds()}
		}
	}
	return st, nil
}
