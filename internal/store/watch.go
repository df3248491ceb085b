package store

// watcher is a coalescing wake-up: one pending signal at most.
type watcher struct{ ch chan struct{} }

// Watch returns a channel that receives a signal after each commit that added
// session items to session. Signals coalesce: a reader that wakes up reads
// everything after its cursor. cancel releases the watch.
func (s *Store) Watch(session string) (wake <-chan struct{}, cancel func()) {
	w := &watcher{ch: make(chan struct{}, 1)}
	s.watchMu.Lock()
	set := s.watchers[session]
	if set == nil {
		set = map[*watcher]struct{}{}
		s.watchers[session] = set
	}
	set[w] = struct{}{}
	s.watchMu.Unlock()
	return w.ch, func() {
		s.watchMu.Lock()
		delete(s.watchers[session], w)
		if len(s.watchers[session]) == 0 {
			delete(s.watchers, session)
		}
		s.watchMu.Unlock()
	}
}

func (s *Store) notify(sessions map[string]bool) {
	if len(sessions) == 0 {
		return
	}
	s.watchMu.Lock()
	defer s.watchMu.Unlock()
	for id, ctl := range sessions {
		if ctl {
			s.control[id]++
		}
		for w := range s.watchers[id] {
			select {
			case w.ch <- struct{}{}:
			default:
			}
		}
	}
}

// ControlGen counts the commits that admitted input to session or moved its
// state. A reader that saw nothing to act on at one count need not look
// again until it changes; read it before the read it guards.
func (s *Store) ControlGen(session string) int64 {
	s.watchMu.Lock()
	defer s.watchMu.Unlock()
	return s.control[session]
}
