package hosts

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
)

// Changes is what a Reconfigure did, by host name.
type Changes struct {
	Added   []string `json:"added,omitempty"`
	Changed []string `json:"changed,omitempty"`
	Removed []string `json:"removed,omitempty"`
}

// Empty says nothing changed.
func (c Changes) Empty() bool { return len(c.Added)+len(c.Changed)+len(c.Removed) == 0 }

// Reconfigure puts hs in force (a reload of klbr.toml's [hosts]). A host
// added is usable at once. A host whose settings changed gets them for its
// next command; if its ssh target, identity or known_hosts changed, its
// connection is closed and the next command dials with the new ones. A
// host removed takes no new work (Reserve, Check and Host no longer know
// it) and is no longer listed, but units already running there are still
// watched, stopped and collected through its connection until Close. Job
// slots taken stay counted across a change.
func (e *Engine) Reconfigure(hs map[string]Host) Changes {
	var out Changes
	var stale []*conn
	for _, name := range slices.Sorted(maps.Keys(hs)) {
		if c, drop := e.reconfigureOne(name, hs[name], &out); drop != nil {
			stale = append(stale, drop)
		} else if c == nil {
			return out // closed
		}
	}
	e.mu.Lock()
	for _, name := range slices.Sorted(maps.Keys(e.conns)) {
		if _, ok := hs[name]; !ok {
			e.retired[name] = e.conns[name]
			delete(e.conns, name)
			out.Removed = append(out.Removed, name)
		}
	}
	e.mu.Unlock()
	for _, c := range stale {
		c.close() // its in-flight commands fail as a lost connection; the next ones dial anew
	}
	if !out.Empty() {
		e.cfg.Log.Info("hosts: reconfigured", "added", out.Added, "changed", out.Changed, "removed", out.Removed)
	}
	return out
}

// reconfigureOne puts h in force for name. It returns the connection now
// in force (nil: the engine is closed) and one to close, if any.
func (e *Engine) reconfigureOne(name string, h Host, out *Changes) (now, stale *conn) {
	e.mu.Lock()
	old, active := e.conns[name]
	if !active {
		old = e.retired[name]
	}
	e.mu.Unlock()
	if old != nil && active && reflect.DeepEqual(old.h, h) {
		return old, nil
	}
	same := old != nil && sameConnection(old.h, h)
	if same {
		// The connection carries over: no connect of old's may run
		// meanwhile, or it would make a master nobody owns.
		old.dial.Lock()
		defer old.dial.Unlock()
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, nil
	}
	n := &conn{e: e, h: h}
	if old != nil {
		old.mu.Lock()
		n.reserved = old.reserved
		if same {
			n.sock = old.sock
			n.master, n.exited, n.lastErr, n.since, n.tried = old.master, old.exited, old.lastErr, old.since, old.tried
			old.master = nil
		}
		old.mu.Unlock()
	}
	if n.sock == "" {
		// A socket of its own: the old master may still be closing on its.
		e.socks++
		n.sock = fmt.Sprintf("%s/r%d.sock", e.controlDir, e.socks)
	}
	e.conns[name] = n
	delete(e.retired, name)
	switch {
	case old == nil || !active:
		out.Added = append(out.Added, name)
	default:
		out.Changed = append(out.Changed, name)
	}
	if old != nil && !same {
		return n, old
	}
	return n, nil
}

// sameConnection says whether a and b reach the host the same way, so
// that a's SSH connection serves b.
func sameConnection(a, b Host) bool {
	return a.Target == b.Target && a.IdentityFile == b.IdentityFile && a.KnownHostsFile == b.KnownHostsFile
}
