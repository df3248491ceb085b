package session

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"sync"

	"github.com/klbr-dev/klbr/internal/store"
)

// DefaultID is the root agent's session, created by init.
const DefaultID = "default"

var idPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$`)

// ValidID reports whether id is a well-formed session id.
func ValidID(id string) bool { return idPattern.MatchString(id) }

// Errors callers branch on.
var (
	ErrDraining = errors.New("session is draining")
	// ErrStopped is returned when an input reaches a stopped session; the
	// store checks it inside the admitting transaction.
	ErrStopped = store.ErrSessionStopped
)

// Unanswered says, for a session an input was just admitted to, why that
// input will not be answered yet: a stopped or paused session waits for the
// operator's start. "" when nothing keeps it from being answered.
func Unanswered(s store.Session) string {
	switch s.State {
	case store.StateStopped, store.StatePaused:
		return fmt.Sprintf("%s is %s: the input is kept, but it will not be answered until `klbr-core start %s`", s.ID, s.State, s.ID)
	}
	return ""
}

// Manager is the runtime side of sessions: the admission gate of each
// session and the count of accepted work in flight, which drain waits for.
type Manager struct {
	store *store.Store

	mu       sync.Mutex                 // guards closed, draining, work and onStop
	closed   bool                       // the daemon is draining: no new work anywhere
	draining map[string]bool            // sessions whose admission is closed by a drain
	work     map[string]*sync.WaitGroup // accepted host work in flight, per session
	onStop   func(ctx context.Context, id string)
}

// OnStop installs who is told after a Transition stopped a session (the
// operator's stop or drain): child agents under it are cancelled.
func (m *Manager) OnStop(f func(ctx context.Context, id string)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.onStop = f
}

// NewManager returns a Manager over st.
func NewManager(st *store.Store) *Manager {
	return &Manager{store: st, draining: map[string]bool{}, work: map[string]*sync.WaitGroup{}}
}

// CheckAdmission tells whether a drain has closed session id's admission.
// (Whether the session exists and is not stopped is checked by the store,
// in the transaction that admits the input.)
func (m *Manager) CheckAdmission(id string) error {
	m.mu.Lock()
	draining := m.draining[id]
	m.mu.Unlock()
	if draining {
		return fmt.Errorf("%w: %s refuses new inputs until the drain finishes", ErrDraining, id)
	}
	return nil
}

// Begin records one piece of accepted host work for session; call done when
// its outcome is recorded. A drain waits for every begun piece.
func (m *Manager) Begin(id string) (done func(), err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed || m.draining[id] {
		return nil, fmt.Errorf("%w: %s", ErrDraining, id)
	}
	wg := m.work[id]
	if wg == nil {
		wg = &sync.WaitGroup{}
		m.work[id] = wg
	}
	wg.Add(1)
	var once sync.Once
	return func() { once.Do(wg.Done) }, nil
}

// Transition moves session id to state to, checked against the lifecycle.
func (m *Manager) Transition(ctx context.Context, id string, to store.SessionState, reason string) (store.Session, error) {
	cur, err := m.store.Session(ctx, id)
	if err != nil {
		return cur, err
	}
	if err := CheckTransition(cur.State, to); err != nil {
		return cur, fmt.Errorf("session %s: %w", id, err)
	}
	if err := m.store.Write(ctx, func(tx *store.Tx) error {
		return tx.TransitionSession(id, cur.State, to, reason)
	}); err != nil {
		return cur, err
	}
	m.mu.Lock()
	onStop := m.onStop
	m.mu.Unlock()
	if to == store.StateStopped && onStop != nil {
		onStop(context.WithoutCancel(ctx), id)
	}
	return m.store.Session(ctx, id)
}

// Drain closes session id's admission, waits until its accepted work has
// finished, and stops it. Inputs already admitted stay pending for when it
// is started again.
func (m *Manager) Drain(ctx context.Context, id string) (store.Session, error) {
	if _, err := m.store.Session(ctx, id); err != nil {
		return store.Session{}, err
	}
	m.mu.Lock()
	if m.draining[id] {
		m.mu.Unlock()
		return store.Session{}, fmt.Errorf("%w: %s is already draining", ErrDraining, id)
	}
	m.draining[id] = true
	wg := m.work[id]
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		delete(m.draining, id)
		m.mu.Unlock()
	}()
	if wg != nil {
		waited := make(chan struct{})
		go func() { wg.Wait(); close(waited) }()
		select {
		case <-waited:
		case <-ctx.Done():
			return store.Session{}, fmt.Errorf("drain %s: %w", id, ctx.Err())
		}
	}
	s, err := m.store.Session(ctx, id)
	if err != nil || s.State == store.StateStopped {
		return s, err
	}
	return m.Transition(ctx, id, store.StateStopped, "drained by operator")
}

// Shutdown refuses new work in every session and waits until the accepted
// work has finished, or ctx ends. Session states are left as they are, so a
// restarted daemon resumes them.
func (m *Manager) Shutdown(ctx context.Context) error {
	m.mu.Lock()
	m.closed = true
	wgs := make([]*sync.WaitGroup, 0, len(m.work))
	for _, wg := range m.work {
		wgs = append(wgs, wg)
	}
	m.mu.Unlock()
	waited := make(chan struct{})
	go func() {
		for _, wg := range wgs {
			wg.Wait()
		}
		close(waited)
	}()
	select {
	case <-waited:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Draining reports whether session id's admission is closed by a drain.
func (m *Manager) Draining(id string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.closed || m.draining[id]
}
