package datadir

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/klbr-dev/klbr/internal/behavior"
	"github.com/klbr-dev/klbr/internal/store"
)

// CheckResult is what Check found.
type CheckResult struct {
	DataDir  string          `json:"data_dir"`
	Findings []store.Finding `json:"findings"`
	Records  int64           `json:"records"`
	Releases int             `json:"releases"`
	Files    int             `json:"artifacts"`
	Schema   int             `json:"schema_version"`
	Duration time.Duration   `json:"duration_ns"`
}

// Clean reports whether the check found no problem (harmless findings aside).
func (r CheckResult) Clean() bool { return len(r.Problems()) == 0 }

// Problems are the findings that are not harmless.
func (r CheckResult) Problems() []store.Finding {
	var out []store.Finding
	for _, f := range r.Findings {
		if !f.Harmless {
			out = append(out, f)
		}
	}
	return out
}

var hexName = regexp.MustCompile(`^[0-9a-f]{64}$`)

// Check verifies a data directory, serving or not (it only reads): the
// database (store.CheckDB: integrity, foreign keys, state machines,
// history coverage), every recorded release against its manifest, and the
// artifacts: recorded but missing or altered, present but unrecorded.
func Check(ctx context.Context, dataDir string) (CheckResult, error) {
	start := time.Now()
	res := CheckResult{DataDir: dataDir, Findings: []store.Finding{}}
	st, err := store.OpenReader(ctx, dataDir)
	if err != nil {
		return res, fmt.Errorf("check: %w", err)
	}
	defer st.Close()
	fs, err := st.CheckDB(ctx)
	if err != nil {
		return res, err
	}
	res.Findings = append(res.Findings, fs...)
	if res.Records, err = st.CountRecords(ctx); err != nil {
		return res, fmt.Errorf("check: %w", err)
	}
	if sc, err := st.Schema(ctx); err == nil {
		res.Schema = sc.Version
	}

	ids, err := st.ReleaseIDs(ctx)
	if err != nil {
		return res, fmt.Errorf("check: releases: %w", err)
	}
	gone, err := st.Tombstoned(ctx, "release")
	if err != nil {
		return res, fmt.Errorf("check: %w", err)
	}
	rel := releasesAt(dataDir)
	for _, id := range ids {
		if gone[id] {
			continue
		}
		res.Releases++
		if _, err := rel.Verify(id); err != nil {
			res.Findings = append(res.Findings, store.Finding{Check: "releases", Subject: "release " + id,
				Problem: err.Error(), Fix: "publish the same tree again (klbr-core publish) to replace it, or restore releases/" + id + " from a backup"})
		}
	}

	recs, err := st.ArtifactRecords(ctx)
	if err != nil {
		return res, fmt.Errorf("check: %w", err)
	}
	dir := filepath.Join(dataDir, "artifacts", "sha256")
	known := map[string]bool{}
	for _, a := range recs {
		known[a.SHA256] = true
		if a.Retention != "retained" {
			continue
		}
		res.Files++
		p := filepath.Join(dir, a.SHA256)
		sum, n, err := hashFile(p)
		switch {
		case os.IsNotExist(err):
			res.Findings = append(res.Findings, store.Finding{Check: "artifacts", Subject: "artifact " + a.SHA256,
				Problem: "recorded but missing", Fix: "restore artifacts/sha256/" + a.SHA256 + " from a backup; records that show it now show it as missing"})
		case err != nil:
			return res, fmt.Errorf("check: %w", err)
		case sum != a.SHA256 || n != a.Size:
			res.Findings = append(res.Findings, store.Finding{Check: "artifacts", Subject: "artifact " + a.SHA256,
				Problem: fmt.Sprintf("its content changed (hashes to %s, %d bytes)", sum, n), Fix: "restore artifacts/sha256/" + a.SHA256 + " from a backup"})
		}
	}
	ents, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		return res, fmt.Errorf("check: %w", err)
	}
	for _, e := range ents {
		if !hexName.MatchString(e.Name()) || known[e.Name()] {
			continue
		}
		res.Findings = append(res.Findings, store.Finding{Check: "artifacts", Subject: "artifacts/sha256/" + e.Name(),
			Problem: "present but no record refers to it", Fix: "klbr-core gc removes it", Harmless: true})
	}
	wf, err := worktreeFindings(ctx, st, dataDir)
	if err != nil {
		return res, err
	}
	res.Findings = append(res.Findings, wf...)
	res.Duration = time.Since(start)
	return res, nil
}

// worktreeFindings names each directory under <data>/worktrees no child's
// spec names: left by a spawn klbr-core did not record (it stopped between
// making the worktree and committing the child).
func worktreeFindings(ctx context.Context, st *store.Store, dataDir string) ([]store.Finding, error) {
	dir := filepath.Join(dataDir, "worktrees")
	ents, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("check: %w", err)
	}
	named, err := st.ChildWorkspaceDirs(ctx)
	if err != nil {
		return nil, fmt.Errorf("check: %w", err)
	}
	tops := map[string]bool{}
	for d := range named {
		if rel, err := filepath.Rel(dir, d); err == nil {
			first, _, _ := strings.Cut(rel, string(filepath.Separator))
			tops[first] = true
		}
	}
	var out []store.Finding
	for _, e := range ents {
		if tops[e.Name()] {
			continue
		}
		p := filepath.Join(dir, e.Name())
		out = append(out, store.Finding{Check: "worktrees", Subject: "worktrees/" + e.Name(), Harmless: true,
			Problem: "present but no child agent's record names it (a spawn that was not recorded)",
			Fix:     "remove it: git -C <workspace> worktree remove --force " + p + " (a copy: rm -rf " + p + "); its branch klbr/" + e.Name() + ", if any, stays"})
	}
	return out, nil
}

// releasesAt is the release directory of dataDir, without creating it.
func releasesAt(dataDir string) *behavior.Releases {
	r, _ := behavior.Open(filepath.Join(dataDir, "releases"))
	return r
}
