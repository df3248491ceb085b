package hooks

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"

	"github.com/pelletier/go-toml/v2"
)

// Binding is how a release binds its hooks beyond SLOTS itself: the
// [hooks] table of its settings.toml.
//
//	[hooks]
//	required = ["execution.review"]      # decision slots that fail closed
//	[hooks.transforms]                   # ordered handlers (keys of SLOTS)
//	"delivery.prepare" = ["delivery.prepare"]
//	[[hooks.observers]]
//	handler = "notes.receipts"           # a key of SLOTS; its state's namespace
//	events = ["delivery.receipt"]
//	state_version = 1
//	migrates_from = []                   # state versions this handler accepts
type Binding struct {
	Required   []string            `toml:"required" json:"required"`
	Transforms map[string][]string `toml:"transforms" json:"transforms"`
	Observers  []ObserverBinding   `toml:"observers" json:"observers"`
}

// ObserverBinding binds one observer handler to event kinds.
type ObserverBinding struct {
	Handler      string   `toml:"handler" json:"handler"`
	Events       []string `toml:"events" json:"events"`
	StateVersion int      `toml:"state_version" json:"state_version"`
	MigratesFrom []int    `toml:"migrates_from" json:"migrates_from"`
}

// Bounds of a binding.
const (
	maxChain     = 8
	maxObservers = 16
)

var handlerName = regexp.MustCompile(`^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*$`)

// ErrBinding marks a release whose [hooks] table is invalid.
var ErrBinding = errors.New("invalid [hooks] binding")

// ReadBinding reads and validates the [hooks] table of the settings.toml in
// tree; a tree without one binds nothing beyond SLOTS.
func ReadBinding(tree string) (Binding, error) {
	var doc struct {
		Hooks Binding `toml:"hooks"`
	}
	b, err := os.ReadFile(filepath.Join(tree, "settings.toml"))
	if errors.Is(err, os.ErrNotExist) {
		return Binding{}, nil
	}
	if err != nil {
		return Binding{}, err
	}
	if err := toml.Unmarshal(b, &doc); err != nil {
		return Binding{}, fmt.Errorf("%w: settings.toml: %v", ErrBinding, err)
	}
	return doc.Hooks, doc.Hooks.validate()
}

func (b Binding) validate() error {
	for _, r := range b.Required {
		s, ok := Lookup(r)
		if !ok || s.Kind != KindDecision {
			return fmt.Errorf("%w: required names %q, which is not a decision slot", ErrBinding, r)
		}
	}
	for slot, chain := range b.Transforms {
		s, ok := Lookup(slot)
		if !ok || s.Kind != KindTransform {
			return fmt.Errorf("%w: transforms names %q, which is not a transform slot", ErrBinding, slot)
		}
		if len(chain) > maxChain {
			return fmt.Errorf("%w: %s has %d handlers (at most %d)", ErrBinding, slot, len(chain), maxChain)
		}
		for _, h := range chain {
			if !handlerName.MatchString(h) || len(h) > 64 {
				return fmt.Errorf("%w: %s: handler %q is not a dotted lowercase name", ErrBinding, slot, h)
			}
		}
	}
	if len(b.Observers) > maxObservers {
		return fmt.Errorf("%w: %d observers (at most %d)", ErrBinding, len(b.Observers), maxObservers)
	}
	seen := map[string]bool{}
	for _, o := range b.Observers {
		if !handlerName.MatchString(o.Handler) || len(o.Handler) > 64 {
			return fmt.Errorf("%w: observer handler %q is not a dotted lowercase name", ErrBinding, o.Handler)
		}
		if seen[o.Handler] {
			return fmt.Errorf("%w: observer %q bound twice", ErrBinding, o.Handler)
		}
		seen[o.Handler] = true
		if len(o.Events) == 0 {
			return fmt.Errorf("%w: observer %q has no events", ErrBinding, o.Handler)
		}
		for _, e := range o.Events {
			s, ok := Lookup(e)
			if !ok || s.Kind != KindObserver {
				return fmt.Errorf("%w: observer %q: %q is not an observer event", ErrBinding, o.Handler, e)
			}
		}
		if o.StateVersion < 0 || o.StateVersion > 1<<20 {
			return fmt.Errorf("%w: observer %q: state_version %d", ErrBinding, o.Handler, o.StateVersion)
		}
	}
	return nil
}

// IsRequired reports whether the release makes slot fail closed.
func (b Binding) IsRequired(slot string) bool { return slices.Contains(b.Required, slot) }

// binding returns release's binding, read once (releases are immutable).
// An unreadable binding binds nothing; the candidate check refuses it.
func (d *Dispatcher) binding(release string) Binding {
	if release == "" || d.cfg.Releases == nil {
		return Binding{}
	}
	d.mu.Lock()
	b, ok := d.bindings[release]
	d.mu.Unlock()
	if ok {
		return b
	}
	b, err := ReadBinding(d.cfg.Releases.Tree(release))
	if err != nil {
		d.cfg.Log.Error("hooks: release binding", "release", release, "error", err)
		b = Binding{}
	}
	d.mu.Lock()
	d.bindings[release] = b
	d.mu.Unlock()
	return b
}

// Binding returns the [hooks] binding of release.
func (d *Dispatcher) Binding(release string) Binding { return d.binding(release) }
