package store

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"
)

// The checkpoint policy, which keeps the WAL bounded under sustained writes:
//
//   - After each commit that leaves the WAL past WALAutocheckpointPages
//     pages, SQLite copies it back into the database with a PASSIVE
//     checkpoint (it never waits for readers or blocks the writer); once a
//     checkpoint completed, the next write starts the WAL over from its
//     beginning, so the file does not grow.
//   - When the WAL is reset its file is truncated to JournalSizeLimitBytes,
//     so a burst's high-water mark does not stay on disk.
//   - Readers that keep taking snapshots (status, scrapes, the turn loop)
//     can keep a PASSIVE checkpoint from ever completing under sustained
//     writes. So when a commit leaves the WAL past RestartCheckpointBytes,
//     the writer runs a RESTART checkpoint: it waits at most
//     RestartCheckpointWait for readers to move to the newest snapshot
//     (that wait, plus copying back what a PASSIVE checkpoint left, is
//     the longest a write is delayed by the policy), copies everything
//     back, and the next write starts the WAL over. A reader that holds
//     its snapshot on (a backup) makes it give up; it tries again once
//     the WAL grew by another RestartRetryBytes, so a long reader costs a
//     write at most one such wait per 8 MiB written.
//   - When the writer has been idle for IdleCheckpointAfter, it runs a
//     TRUNCATE checkpoint (waiting at most IdleCheckpointWait for readers,
//     so a write arriving meanwhile waits no longer than that): the WAL
//     goes back to zero bytes between bursts.
//
// A reader that holds a snapshot for a long time (a backup) holds back the
// WAL's reset, so the WAL grows by what is written meanwhile; WALBoundBytes
// is the bound klbr keeps to otherwise, and what the alert rules and
// doctor warn past.
const (
	WALAutocheckpointPages = 1000
	JournalSizeLimitBytes  = 4 << 20
	IdleCheckpointAfter    = time.Second
	IdleCheckpointWait     = 100 * time.Millisecond
	WALBoundBytes          = 64 << 20
	RestartCheckpointBytes = 16 << 20
	RestartCheckpointWait  = 100 * time.Millisecond
	RestartRetryBytes      = 8 << 20
)

// checkpointStats count the writer's own checkpoints.
type checkpointStats struct {
	idle     atomic.Uint64
	failed   atomic.Uint64
	restarts atomic.Uint64
	longest  atomic.Int64 // nanoseconds of the longest RESTART checkpoint: the policy's writer stall

	// Only the writer goroutine uses these.
	nextRestart int64 // the WAL size of the next RESTART attempt; 0: RestartCheckpointBytes
}

// walPath is the database's WAL file.
func (s *Store) walPath() string { return filepath.Join(s.dir, FileName+"-wal") }

// idleCheckpoint truncates the WAL while nothing writes. It runs on the
// writer goroutine, between batches.
func (s *Store) idleCheckpoint() {
	if s.Fault() != nil {
		return // the storage probe decides when writes work again; files stay as they are
	}
	fi, err := os.Stat(s.walPath())
	if err != nil || fi.Size() == 0 {
		return
	}
	if s.checkpoint("TRUNCATE", IdleCheckpointWait) {
		s.ckpt.idle.Add(1)
	} else {
		s.ckpt.failed.Add(1) // a reader held on; the next idle period tries again
	}
}

// restartCheckpoint runs after a batch: past RestartCheckpointBytes it
// makes the next write start the WAL over.
func (s *Store) restartCheckpoint() {
	if s.Fault() != nil {
		return
	}
	fi, err := os.Stat(s.walPath())
	if err != nil || fi.Size() < max(RestartCheckpointBytes, s.ckpt.nextRestart) {
		return
	}
	start := time.Now()
	if s.checkpoint("RESTART", RestartCheckpointWait) {
		s.ckpt.restarts.Add(1)
		s.ckpt.nextRestart = 0
	} else {
		s.ckpt.failed.Add(1)
		s.ckpt.nextRestart = fi.Size() + RestartRetryBytes
	}
	if d := time.Since(start).Nanoseconds(); d > s.ckpt.longest.Load() {
		s.ckpt.longest.Store(d)
	}
}

// checkpoint runs a blocking checkpoint mode on the writer's connection,
// waiting at most wait for readers; it reports whether it completed.
func (s *Store) checkpoint(mode string, wait time.Duration) bool {
	ctx := context.Background()
	conn, err := s.wdb.Conn(ctx)
	if err != nil {
		return false
	}
	defer conn.Close()
	defer conn.ExecContext(ctx, fmt.Sprintf("PRAGMA busy_timeout = %d", BusyTimeoutMillis))
	if _, err := conn.ExecContext(ctx, fmt.Sprintf("PRAGMA busy_timeout = %d", wait.Milliseconds())); err != nil {
		return false
	}
	var busy, logFrames, done int
	if err := conn.QueryRowContext(ctx, "PRAGMA wal_checkpoint("+mode+")").Scan(&busy, &logFrames, &done); err != nil || busy != 0 {
		return false
	}
	return true
}

// CheckpointStats are the writer's own checkpoints.
type CheckpointStats struct {
	Idle        uint64        // TRUNCATE checkpoints while idle
	Restarts    uint64        // RESTART checkpoints past RestartCheckpointBytes
	HeldOff     uint64        // checkpoints a reader held off (tried again later)
	LongestStop time.Duration // the longest RESTART: the longest a write waited on the policy
}

// CheckpointStats reports the writer's own checkpoints.
func (s *Store) CheckpointStats() CheckpointStats {
	return CheckpointStats{Idle: s.ckpt.idle.Load(), Restarts: s.ckpt.restarts.Load(), HeldOff: s.ckpt.failed.Load(),
		LongestStop: time.Duration(s.ckpt.longest.Load())}
}
