package datadir

import (
	"context"
	"fmt"
	"time"

	"github.com/klbr-dev/klbr/internal/store"
)

// History retention runs in bounded batches, each its own transaction
// through the store's one writer, so writers (turns, admissions) interleave
// between them and wait for at most one batch.
const (
	historyScan       = 256       // candidates read at a time (on a reader)
	historyBatch      = 32        // originals collected per transaction
	historyBatchBytes = 256 << 10 // … or this much content, whichever comes first
)

// collectHistory collects the content of originals received more than
// days before now that a normal summary covers and no running child's
// grant names (store.CollectableEvents), oldest first.
func collectHistory(ctx context.Context, st *store.Store, days int, now time.Time) (store.CollectedHistory, error) {
	var out store.CollectedHistory
	cutoff := now.Add(-time.Duration(days) * 24 * time.Hour)
	through, err := st.HistoryCutoffID(ctx, cutoff)
	if err != nil || through == 0 {
		return out, err
	}
	pins, err := st.HistoryPinsNow(ctx)
	if err != nil {
		return out, err
	}
	reason := fmt.Sprintf("retention.history_days = %d: received before %s, and a summary covers it",
		days, cutoff.UTC().Format(time.DateOnly))
	var after int64
	for {
		evs, last, err := st.CollectableEvents(ctx, after, through, cutoff, pins, historyScan)
		if err != nil {
			return out, err
		}
		for len(evs) > 0 {
			if err := ctx.Err(); err != nil {
				return out, err
			}
			n, size := 0, int64(0)
			for n < len(evs) && n < historyBatch && (n == 0 || size+evs[n].Bytes <= historyBatchBytes) {
				size += evs[n].Bytes
				n++
			}
			var got store.CollectedHistory
			t0 := time.Now()
			if err := st.Write(ctx, func(tx *store.Tx) error {
				got = store.CollectedHistory{}
				for _, e := range evs[:n] {
					b, err := tx.CollectEvent(e.ID, reason)
					if err != nil {
						return err
					}
					if b > 0 {
						got.Records++
						got.Bytes += b
					}
				}
				return nil
			}); err != nil {
				return out, fmt.Errorf("gc: history: %w", err)
			}
			out.Records += got.Records
			out.Bytes += got.Bytes
			evs = evs[n:]
			// As long again idle: the writer's own commits (a turn's steps,
			// admissions) find it free at least half the time.
			if err := sleepCtx(ctx, min(time.Since(t0), 50*time.Millisecond)); err != nil {
				return out, err
			}
		}
		if last == 0 {
			return out, nil
		}
		after = last
	}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
