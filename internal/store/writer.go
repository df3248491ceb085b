package store

import (
	"context"
	"database/sql"
	"fmt"
	"runtime"
	"runtime/debug"
	"sync/atomic"
	"time"
)

// writeReq is one caller's write function waiting for the writer.
type writeReq struct {
	ctx  context.Context
	fn   func(*Tx) error
	done chan error // buffered(1): the writer never blocks on a caller
}

// writerStats are monotonic counters of the writer path.
type writerStats struct {
	batches atomic.Uint64
	writes  atomic.Uint64
	failed  atomic.Uint64
}

// WriterStats is a snapshot of the writer's counters.
type WriterStats struct {
	Batches uint64 // committed or failed transactions
	Writes  uint64 // write functions applied
	Failed  uint64 // write functions that returned an error or lost their commit
}

// Stats reads the writer's counters.
func (s *Store) Stats() WriterStats {
	return WriterStats{Batches: s.stats.batches.Load(), Writes: s.stats.writes.Load(), Failed: s.stats.failed.Load()}
}

// Write runs fn inside the writer's next transaction and returns once that
// transaction committed (nil) or fn failed (its error; its changes were rolled
// back to its savepoint and nothing of it is visible). fn must only use tx,
// must not block on anything outside the database, and must not retain tx.
// fn may run twice: when another write in its batch fails, the batch is
// rolled back and run again with a savepoint around each write. So fn must
// assign its results, never accumulate them across calls.
//
// If ctx ends while the write is queued it is not applied; if it ends after
// the writer took it, Write returns ctx.Err() and the write may still commit,
// which is why every admission carries an idempotency key.
func (s *Store) Write(ctx context.Context, fn func(*Tx) error) error {
	r := &writeReq{ctx: ctx, fn: fn, done: make(chan error, 1)}
	select {
	case s.reqs <- r:
	case <-s.closing:
		return ErrClosed
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-r.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// writer is the only goroutine that writes. It takes one request, then every
// request already waiting (up to maxBatch), and commits them together.
func (s *Store) writer() {
	defer close(s.done)
	batch := make([]*writeReq, 0, s.maxBatch)
	idle := time.NewTimer(IdleCheckpointAfter)
	defer idle.Stop()
	for {
		select {
		case r := <-s.reqs:
			batch = append(batch[:0], r)
		case <-idle.C:
			s.idleCheckpoint() // nothing was written for a while: truncate the WAL
			continue
		case <-s.closing:
			return
		}
		idle.Reset(IdleCheckpointAfter)
		// Let the callers just answered submit again before the batch is
		// cut: with closed-loop callers this roughly doubles the batch.
		runtime.Gosched()
	collect:
		for len(batch) < s.maxBatch {
			select {
			case r := <-s.reqs:
				batch = append(batch, r)
			default:
				break collect
			}
		}
		s.runBatch(batch)
		clear(batch)
		s.restartCheckpoint()
	}
}

func (s *Store) runBatch(batch []*writeReq) {
	defer s.stmts.endTx()
	s.stats.batches.Add(1)
	now := s.clock()
	// Optimistic pass without savepoints: almost every write succeeds. If one
	// fails, the pass is rolled back and the batch runs again with a
	// savepoint around each write, so the failure sinks only its own write.
	res, ok := s.tryBatch(batch, now, len(batch) == 1)
	if !ok {
		s.stmts.endTx()
		res, _ = s.tryBatch(batch, now, true)
	}
	if res.fatal != nil {
		fatal := s.classify(res.fatal)
		for i, r := range batch {
			if res.results[i] == nil {
				res.results[i] = fatal
			}
			r.done <- s.classify(res.results[i])
		}
		s.stats.failed.Add(uint64(len(batch)))
		return
	}
	for i := range res.results {
		res.results[i] = s.classify(res.results[i]) // a write's own statement may have hit the fault
	}
	if res.applied > 0 {
		s.recovered()
	}
	s.stats.writes.Add(uint64(res.applied))
	s.stats.failed.Add(uint64(len(batch) - res.applied))
	s.notify(res.touched) // before answering, so a watcher never lags an acknowledged write
	for i, r := range batch {
		r.done <- res.results[i]
	}
}

type batchResult struct {
	results []error
	touched map[string]bool // session → whether a control-relevant change was among its items
	applied int
	fatal   error // the transaction itself failed: nothing was committed
}

// tryBatch applies batch in one transaction and commits it. With isolate, a
// savepoint around each write confines a failing write to itself; without,
// the first failing write aborts the pass (ok is false, nothing committed).
func (s *Store) tryBatch(batch []*writeReq, now time.Time, isolate bool) (res batchResult, ok bool) {
	res = batchResult{results: make([]error, len(batch)), touched: map[string]bool{}}
	tx, err := s.wdb.BeginTx(context.Background(), nil)
	if err != nil {
		res.fatal = fmt.Errorf("store: begin: %w", err)
		return res, true
	}
	abort := func(err error) (batchResult, bool) {
		tx.Rollback()
		res.fatal = err
		return res, true
	}
	for i, r := range batch {
		if err := r.ctx.Err(); err != nil {
			res.results[i] = err // the caller gave up before its turn; never applied
			continue
		}
		t := &Tx{tx: tx, now: now, stmts: s.stmts, s: s}
		if isolate {
			if _, err := t.exec("SAVEPOINT w"); err != nil {
				return abort(fmt.Errorf("store: savepoint: %w", err))
			}
		}
		if err := callWrite(r.fn, t); err != nil {
			res.results[i] = err
			if !isolate {
				tx.Rollback()
				return res, len(batch) == 1 // a lone write's failure is final
			}
			_, rerr := t.exec("ROLLBACK TO w")
			if rerr == nil {
				_, rerr = t.exec("RELEASE w")
			}
			if rerr != nil {
				return abort(fmt.Errorf("store: rollback to savepoint: %w", rerr))
			}
			s.stmts.forgetSessions() // the rolled-back write may have moved one
			continue
		}
		if isolate {
			if _, err := t.exec("RELEASE w"); err != nil {
				return abort(fmt.Errorf("store: release savepoint: %w", err))
			}
		}
		res.applied++
		for id, ctl := range t.touched {
			res.touched[id] = res.touched[id] || ctl
		}
	}
	if err := tx.Commit(); err != nil {
		return abort(fmt.Errorf("store: commit: %w", err))
	}
	return res, true
}

// callWrite runs fn, turning a panic into an error so that one bad write
// function cannot take the writer (and every other caller) down.
func callWrite(fn func(*Tx) error, t *Tx) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("store: write panicked: %v\n%s", p, debug.Stack())
		}
	}()
	return fn(t)
}

// Tx is the writer's transaction as seen by one write function.
type Tx struct {
	tx      *sql.Tx
	now     time.Time
	stmts   *stmtCache
	touched map[string]bool // sessions with new session items → whether one was a control change
	s       *Store
}

// Now is the batch's timestamp; every write in one batch shares it.
func (t *Tx) Now() time.Time { return t.now }

func (t *Tx) touch(session string) {
	if t.touched == nil {
		t.touched = map[string]bool{}
	}
	if _, ok := t.touched[session]; !ok {
		t.touched[session] = false
	}
}

// controlled marks a change a running attempt must look at: an admitted
// input, a session state move (see Store.ControlGen).
func (t *Tx) controlled(session string) {
	t.touch(session)
	t.touched[session] = true
}

// exec, queryRow and query run a statement prepared once on the writer's
// connection: parsing SQL again for every admission would cost more than
// the admission itself.
func (t *Tx) exec(query string, args ...any) (sql.Result, error) {
	st, err := t.stmt(query)
	if err != nil {
		return nil, err
	}
	return st.Exec(args...)
}

func (t *Tx) queryRow(query string, args ...any) *sql.Row {
	st, err := t.stmt(query)
	if err != nil {
		return t.tx.QueryRow(query, args...) // its Scan reports the same error
	}
	return st.QueryRow(args...)
}

func (t *Tx) query(query string, args ...any) (*sql.Rows, error) {
	st, err := t.stmt(query)
	if err != nil {
		return nil, err
	}
	return st.Query(args...)
}

// stmt returns query prepared for this transaction: from the cache when it
// was seen before, otherwise prepared inside the transaction (the writer has
// one connection, which the transaction holds) and noted for the cache.
func (t *Tx) stmt(query string) (*sql.Stmt, error) {
	c := t.stmts
	if st, ok := c.inTx[query]; ok {
		return st, nil
	}
	var st *sql.Stmt
	if prepared, ok := c.m[query]; ok {
		st = t.tx.Stmt(prepared)
	} else {
		c.missed[query] = struct{}{}
		var err error
		if st, err = t.tx.Prepare(query); err != nil {
			return nil, err
		}
	}
	c.inTx[query] = st
	return st, nil
}

// stmtCache holds the writer's prepared statements, and their bindings to
// the current transaction, shared by every write of a batch. Only the
// writer goroutine uses it, so it needs no lock.
type stmtCache struct {
	db     *sql.DB
	m      map[string]*sql.Stmt // prepared on the writer's connection
	inTx   map[string]*sql.Stmt // bound to the current transaction
	missed map[string]struct{}  // seen in this transaction, not yet in m

	// states caches session states read in the current transaction, so a
	// batch of admissions reads each session once. Every write that can
	// change a session's state drops its entry.
	states map[string]SessionState
}

func (c *stmtCache) forgetSessions() { clear(c.states) }

// endTx forgets the transaction's bindings (the transaction closed them)
// and prepares the statements it missed, now that the connection is free.
func (c *stmtCache) endTx() {
	clear(c.inTx)
	clear(c.states)
	for q := range c.missed {
		if st, err := c.db.Prepare(q); err == nil {
			c.m[q] = st
		}
		delete(c.missed, q)
	}
}

func (c *stmtCache) close() {
	for _, st := range c.m {
		st.Close()
	}
	clear(c.m)
}
