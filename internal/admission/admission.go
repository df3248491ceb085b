// Package admission is the one door inputs come through: it validates an
// input, checks that the door it came through has the authority for its
// source kind, and acknowledges it only after the store committed it.
package admission

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/klbr-dev/klbr/internal/session"
	"github.com/klbr-dev/klbr/internal/store"
)

// SourceKind says where an input came from, and so what authority it has.
type SourceKind string

// The source kinds.
const (
	SourceOperator SourceKind = "operator" // the operator: control socket or browser
	SourceDiscord  SourceKind = "discord"  // a Discord participant, through ingress
)

// Door is the listener an input arrived on. Authority comes from the door,
// never from anything inside the input.
type Door string

// The doors.
const (
	DoorOperatorAPI Door = "operator_api" // control.sock
	DoorBrowser     Door = "browser"      // the web UI's socket
	DoorIngress     Door = "ingress"      // ingress.sock (klbr-discord)
)

// mayCreate lists the source kinds each door may create.
var mayCreate = map[Door][]SourceKind{
	DoorOperatorAPI: {SourceOperator},
	DoorBrowser:     {SourceOperator},
	DoorIngress:     {SourceDiscord},
}

// Bounds on an input's fields.
const (
	MaxBodyBytes  = 64 << 10
	MaxKeyBytes   = 256
	MaxLabelBytes = 256
)

// Errors callers branch on.
var (
	ErrInvalid   = errors.New("invalid input")
	ErrForbidden = errors.New("source kind not allowed through this door")
	ErrDraining  = errors.New("klbr-core is draining")
)

// maxKindPrefix is the most StoredKey adds ("operator:").
const maxKindPrefix = 16

// StoredKey is the dedupe key an input is stored under. Operator keys get their own name
// space, "operator:<key>", so that no operator key can shadow a Discord message (an
// operator key "discord:123" is stored as "operator:discord:123"; the ingress names Discord
// messages "discord:<id>" and gaps "discord-gap:<id>", which never start with
// "operator:"). A key that already carries the prefix is kept as it is.
func StoredKey(kind SourceKind, key string) string {
	if kind != SourceOperator {
		return key // the ingress namespaces its own keys
	}
	prefix := string(kind) + ":"
	if strings.HasPrefix(key, prefix) {
		return key
	}
	return prefix + key
}

// Input is an input as a door hands it over.
type Input struct {
	Session      string
	SourceKind   SourceKind
	SourceKey    string // canonical, unique per session: a retry with the same key is a duplicate
	Conversation string
	Author       string
	// Directed marks a Discord DM or mention: it demands attention. Operator
	// input is always directed.
	Directed   bool
	OccurredAt time.Time // when the source says it happened; zero means now
	Body       string
	// Maintenance marks an operator input as a maintenance goal.
	Maintenance bool
}

// Result names the outcomes admissions are counted by.
type Result string

// The admission results.
const (
	ResultAccepted  Result = "accepted"
	ResultDuplicate Result = "duplicate"
	ResultInvalid   Result = "invalid"
	ResultRefused   Result = "refused" // authority, unknown session, draining, stopped
	ResultError     Result = "error"   // the store failed
)

// Admitter admits inputs.
type Admitter struct {
	store    *store.Store
	sessions *session.Manager
	clock    func() time.Time
	observe  func(SourceKind, Result)

	mu       sync.Mutex     // guards closed, and Add on inflight against Wait
	closed   bool           // draining: every new admission is refused
	inflight sync.WaitGroup // admissions accepted through the gate, not yet answered
}

// New returns an Admitter. observe, if non-nil, is told each admission's result.
func New(st *store.Store, sessions *session.Manager, clock func() time.Time, observe func(SourceKind, Result)) *Admitter {
	if clock == nil {
		clock = time.Now
	}
	if observe == nil {
		observe = func(SourceKind, Result) {}
	}
	return &Admitter{store: st, sessions: sessions, clock: clock, observe: observe}
}

// Admit validates in, checks the door's authority and the session's gate,
// and commits it. It returns only after the commit: a nil error means the
// input is durable. A repeated source key returns the original identity with
// Duplicate set.
func (a *Admitter) Admit(ctx context.Context, door Door, in Input) (store.Admitted, error) {
	if err := Validate(door, in); err != nil {
		if errors.Is(err, ErrForbidden) {
			a.observe(in.SourceKind, ResultRefused)
		} else {
			a.observe(in.SourceKind, ResultInvalid)
		}
		return store.Admitted{}, err
	}
	if !a.enter() {
		a.observe(in.SourceKind, ResultRefused)
		return store.Admitted{}, fmt.Errorf("%w: it accepts no new input; retry once it has restarted", ErrDraining)
	}
	defer a.inflight.Done()
	if err := a.sessions.CheckAdmission(in.Session); err != nil {
		a.observe(in.SourceKind, ResultRefused)
		return store.Admitted{}, err
	}
	now := a.clock()
	occurred := in.OccurredAt
	if occurred.IsZero() {
		occurred = now
	}
	var got store.Admitted
	err := a.store.Write(ctx, func(tx *store.Tx) (err error) {
		got, err = tx.AdmitInput(store.NewInput{
			Session: in.Session, SourceKind: string(in.SourceKind), SourceKey: StoredKey(in.SourceKind, in.SourceKey),
			Conversation: in.Conversation, Author: in.Author,
			Directed:   in.Directed || in.SourceKind == SourceOperator,
			OccurredAt: occurred, ReceivedAt: now, Body: in.Body, Maintenance: in.Maintenance && in.SourceKind == SourceOperator,
		})
		return err
	})
	switch {
	case errors.Is(err, store.ErrUnknownSession), errors.Is(err, store.ErrSessionStopped):
		a.observe(in.SourceKind, ResultRefused)
		return got, err
	case err != nil:
		a.observe(in.SourceKind, ResultError)
		return got, fmt.Errorf("admit: %w", err)
	case got.Duplicate:
		a.observe(in.SourceKind, ResultDuplicate)
	default:
		a.observe(in.SourceKind, ResultAccepted)
	}
	return got, nil
}

// AdmitBatch admits ins, all through door, in one store transaction (one
// fsync for the batch), and calls then for each admitted input (duplicates
// included) inside that transaction, so that what the door records about an
// input commits with it. Invalid or refused inputs get their error in errs
// and are left out; the others are durable when err is nil. then must be pure
// (it may run twice, see store.Write) and a failure of then fails the batch.
func (a *Admitter) AdmitBatch(ctx context.Context, door Door, ins []Input, then func(tx *store.Tx, i int, got store.Admitted) error) (got []store.Admitted, errs []error, err error) {
	got, errs = make([]store.Admitted, len(ins)), make([]error, len(ins))
	var ok []int
	for i, in := range ins {
		if err := Validate(door, in); err != nil {
			if errors.Is(err, ErrForbidden) {
				a.observe(in.SourceKind, ResultRefused)
			} else {
				a.observe(in.SourceKind, ResultInvalid)
			}
			errs[i] = err
			continue
		}
		if err := a.sessions.CheckAdmission(in.Session); err != nil {
			a.observe(in.SourceKind, ResultRefused)
			errs[i] = err
			continue
		}
		ok = append(ok, i)
	}
	if len(ok) == 0 {
		return got, errs, nil
	}
	if !a.enter() {
		for _, i := range ok {
			a.observe(ins[i].SourceKind, ResultRefused)
		}
		return got, errs, fmt.Errorf("%w: it accepts no new input; retry once it has restarted", ErrDraining)
	}
	defer a.inflight.Done()
	now := a.clock()
	err = a.store.Write(ctx, func(tx *store.Tx) error {
		for _, i := range ok {
			in := ins[i]
			occurred := in.OccurredAt
			if occurred.IsZero() {
				occurred = now
			}
			g, err := tx.AdmitInput(store.NewInput{
				Session: in.Session, SourceKind: string(in.SourceKind), SourceKey: StoredKey(in.SourceKind, in.SourceKey),
				Conversation: in.Conversation, Author: in.Author,
				Directed:   in.Directed || in.SourceKind == SourceOperator,
				OccurredAt: occurred, ReceivedAt: now, Body: in.Body, Maintenance: in.Maintenance && in.SourceKind == SourceOperator,
			})
			if err != nil {
				return err
			}
			got[i] = g
			if then != nil {
				if err := then(tx, i, g); err != nil {
					return err
				}
			}
		}
		return nil
	})
	for _, i := range ok {
		switch {
		case errors.Is(err, store.ErrUnknownSession), errors.Is(err, store.ErrSessionStopped):
			a.observe(ins[i].SourceKind, ResultRefused)
		case err != nil:
			a.observe(ins[i].SourceKind, ResultError)
		case got[i].Duplicate:
			a.observe(ins[i].SourceKind, ResultDuplicate)
		default:
			a.observe(ins[i].SourceKind, ResultAccepted)
		}
	}
	if err != nil {
		return make([]store.Admitted, len(ins)), errs, fmt.Errorf("admit: %w", err)
	}
	return got, errs, nil
}

func (a *Admitter) enter() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return false
	}
	a.inflight.Add(1)
	return true
}

// Close refuses every later admission with ErrDraining and waits until the
// admissions already past the gate have been answered, or ctx ends.
func (a *Admitter) Close(ctx context.Context) error {
	a.mu.Lock()
	a.closed = true
	a.mu.Unlock()
	done := make(chan struct{})
	go func() { a.inflight.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Draining reports whether Close was called.
func (a *Admitter) Draining() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.closed
}

// Validate checks an input's fields and the door's authority for its kind.
func Validate(door Door, in Input) error {
	kinds, ok := mayCreate[door]
	if !ok {
		return fmt.Errorf("%w: unknown door %q", ErrForbidden, door)
	}
	switch in.SourceKind {
	case SourceOperator, SourceDiscord:
	default:
		return fmt.Errorf("%w: unknown source kind %q (want operator or discord)", ErrInvalid, in.SourceKind)
	}
	allowed := false
	for _, k := range kinds {
		allowed = allowed || k == in.SourceKind
	}
	if !allowed {
		return fmt.Errorf("%w: %s inputs cannot come through the %s", ErrForbidden, in.SourceKind, door)
	}
	if !session.ValidID(in.Session) {
		return fmt.Errorf("%w: session %q: want 1-64 letters, digits, '-' or '_'", ErrInvalid, in.Session)
	}
	for _, f := range []struct {
		name  string
		value string
		min   int
		max   int
	}{
		{"body", in.Body, 1, MaxBodyBytes},
		{"source_key", in.SourceKey, 1, MaxKeyBytes - maxKindPrefix},
		{"conversation", in.Conversation, 1, MaxLabelBytes},
		{"author", in.Author, 1, MaxLabelBytes},
	} {
		if len(f.value) < f.min {
			return fmt.Errorf("%w: %s is empty", ErrInvalid, f.name)
		}
		if len(f.value) > f.max {
			return fmt.Errorf("%w: %s is %d bytes, at most %d", ErrInvalid, f.name, len(f.value), f.max)
		}
		if !utf8.ValidString(f.value) {
			return fmt.Errorf("%w: %s is not valid UTF-8", ErrInvalid, f.name)
		}
		for _, r := range f.value {
			if r == 0 {
				return fmt.Errorf("%w: %s contains a NUL character", ErrInvalid, f.name)
			}
		}
	}
	return nil
}
