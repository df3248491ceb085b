package datadir

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/klbr-dev/klbr/internal/artifacts"
	"github.com/klbr-dev/klbr/internal/config"
	"github.com/klbr-dev/klbr/internal/store"
)

// GCResult is what garbage collection removed and what it kept because it
// is pinned.
type GCResult struct {
	Removed []store.TombstoneRecord `json:"removed"`
	Pinned  map[string][]string     `json:"pinned_releases"` // release → why it stays
	Bytes   int64                   `json:"bytes_freed"`
	// History is what [retention] history_days collected of the history
	// originals in this run: records and bytes of content (space inside
	// runtime.sqlite that new records reuse; the file does not shrink).
	History store.CollectedHistory `json:"history_collected"`
}

// maxDraftRecord bounds a draft.json read for its parent release.
const maxDraftRecord = 64 << 10

// GCOptions are what garbage collection needs to run while klbr-core
// serves.
type GCOptions struct {
	// Artifacts is the store cells write to: set, removals go through it
	// so that content stored again meanwhile is kept.
	Artifacts *artifacts.Store
	// Freed is told the bytes of each removal (diskuse.Meter.Removed).
	Freed func(int64)
}

// GC removes, under the retention settings, the artifacts and then the
// releases nothing pins, leaving a tombstone with the reason for each, each
// in a transaction of its own. It needs the store open for writing
// (klbr-core stopped, or run by klbr-core itself: Collect). Zero settings
// remove nothing.
func GC(ctx context.Context, st *store.Store, r config.Retention, now time.Time) (GCResult, error) {
	return Collect(ctx, st, r, now, GCOptions{})
}

// Collect is GC with the options of a running klbr-core.
func Collect(ctx context.Context, st *store.Store, r config.Retention, now time.Time, opts GCOptions) (GCResult, error) {
	res := GCResult{Pinned: map[string][]string{}}
	dataDir := st.Dir()
	pins, err := st.ReleasePins(ctx)
	if err != nil {
		return res, err
	}
	for _, p := range pins {
		res.Pinned[p.Release] = append(res.Pinned[p.Release], p.Reason)
	}
	drafts, err := draftPins(filepath.Join(dataDir, "drafts"))
	if err != nil {
		return res, err
	}
	for id, rel := range drafts {
		res.Pinned[rel] = append(res.Pinned[rel], "parent of draft "+id)
	}
	if r.ArtifactDays > 0 {
		cutoff := now.Add(-time.Duration(r.ArtifactDays) * 24 * time.Hour)
		arts, err := st.CollectableArtifacts(ctx, cutoff)
		if err != nil {
			return res, err
		}
		for _, a := range arts {
			if err := ctx.Err(); err != nil {
				return res, err
			}
			t0 := time.Now()
			reason := fmt.Sprintf("retention.artifact_days = %d: older, and no record of an active context refers to it", r.ArtifactDays)
			record := func() error {
				return st.Write(ctx, func(tx *store.Tx) error { return tx.Tombstone("artifact", a.SHA256, a.Size, reason) })
			}
			if opts.Artifacts != nil {
				// Online: content stored again since the cutoff stays, and a
				// commit of the same content waits for the removal.
				gone, err := opts.Artifacts.RemoveIf(a.SHA256, cutoff, record)
				if err != nil {
					return res, fmt.Errorf("gc: artifact %s: %w", a.SHA256, err)
				}
				if !gone {
					continue
				}
			} else {
				if err := record(); err != nil {
					return res, err
				}
				if err := os.Remove(filepath.Join(dataDir, "artifacts", "sha256", a.SHA256)); err != nil && !os.IsNotExist(err) {
					return res, fmt.Errorf("gc: artifact %s: %w", a.SHA256, err)
				}
			}
			res.Removed = append(res.Removed, store.TombstoneRecord{Kind: "artifact", Ref: a.SHA256, Size: a.Size, Reason: reason, RemovedAt: now})
			res.Bytes += a.Size
			if opts.Freed != nil {
				opts.Freed(a.Size)
			}
			if opts.Artifacts != nil { // online: leave the writer free half the time
				if err := sleepCtx(ctx, min(time.Since(t0), 50*time.Millisecond)); err != nil {
					return res, err
				}
			}
		}
	}
	if r.HistoryDays > 0 {
		h, err := collectHistory(ctx, st, r.HistoryDays, now)
		res.History = h
		if err != nil {
			return res, err
		}
	}
	if r.ReleasesKeep > 0 {
		ages, err := st.ReleaseAges(ctx)
		if err != nil {
			return res, err
		}
		gone, err := st.Tombstoned(ctx, "release")
		if err != nil {
			return res, err
		}
		kept := 0
		for _, a := range ages {
			if gone[a.ID] {
				continue
			}
			if _, pinned := res.Pinned[a.ID]; pinned {
				continue
			}
			if kept < r.ReleasesKeep {
				kept++
				continue
			}
			dir := filepath.Join(dataDir, "releases", a.ID)
			size := treeBytes(dir)
			reason := fmt.Sprintf("retention.releases_keep = %d: older than the %d newest unpinned releases (published %s)",
				r.ReleasesKeep, r.ReleasesKeep, a.PublishedAt.UTC().Format(time.RFC3339))
			if err := st.Write(ctx, func(tx *store.Tx) error { return tx.Tombstone("release", a.ID, size, reason) }); err != nil {
				return res, err
			}
			if err := removeTree(dir); err != nil {
				return res, fmt.Errorf("gc: release %s: %w", a.ID, err)
			}
			res.Removed = append(res.Removed, store.TombstoneRecord{Kind: "release", Ref: a.ID, Size: size, Reason: reason, RemovedAt: now})
			res.Bytes += size
			if opts.Freed != nil {
				opts.Freed(size)
			}
		}
	}
	return res, nil
}

// draftPins reads each draft's parent release (drafts/<id>/draft.json).
func draftPins(dir string) (map[string]string, error) {
	out := map[string]string{}
	ents, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return out, nil
	}
	if err != nil {
		return nil, fmt.Errorf("gc: drafts: %w", err)
	}
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		f, err := os.Open(filepath.Join(dir, e.Name(), "draft.json"))
		if err != nil {
			continue
		}
		b, err := io.ReadAll(io.LimitReader(f, maxDraftRecord))
		f.Close()
		if err != nil {
			return nil, err
		}
		var rec struct {
			ParentRelease string `json:"parent_release"`
		}
		if json.Unmarshal(b, &rec) != nil {
			// An unreadable draft record pins nothing it names; say so by failing:
			// removing a release a draft may still need is not a guess gc makes.
			return nil, fmt.Errorf("gc: drafts/%s/draft.json cannot be read; fix or remove the draft first", e.Name())
		}
		if rec.ParentRelease != "" {
			out[e.Name()] = rec.ParentRelease
		}
	}
	return out, nil
}

func treeBytes(root string) int64 {
	var n int64
	filepath.WalkDir(root, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}

// removeTree removes a release directory, whose files and directories are read-only.
func removeTree(root string) error {
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			os.Chmod(p, 0o700)
		}
		return nil
	})
	return os.RemoveAll(root)
}
