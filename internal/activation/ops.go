package activation

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/klbr-dev/klbr/internal/behavior"
	"github.com/klbr-dev/klbr/internal/celltree"
	"github.com/klbr-dev/klbr/internal/hooks"
	"github.com/klbr-dev/klbr/internal/hostgit"
	"github.com/klbr-dev/klbr/internal/store"
	"github.com/klbr-dev/klbr/internal/workbench"
	"github.com/klbr-dev/klbr/internal/worker"
)

// Ops answers the behavior.* and hooks.* host requests of cells: the agent
// editing its own behavior through drafts, releases and activations.
type Ops struct {
	svc      *Service
	drafts   string // <data>/drafts
	uid, gid int    // owner of new drafts' trees; -1: the daemon's
	// git runs the drafts' diffs and rebases in scratch repositories of the
	// host's own (<data>/hostgit), never in a draft; nil: git is missing.
	git *hostgit.Git

	mu      sync.Mutex       // guards parents
	parents map[string]int64 // release → parent epoch of the draft it was published from
}

// NewOps returns the handler; drafts is <data>/drafts. Its git keeps its
// state in <data>/hostgit, which no sandbox grant reaches.
func NewOps(svc *Service, drafts string) *Ops {
	o := &Ops{svc: svc, drafts: drafts, parents: map[string]int64{}, uid: -1, gid: -1}
	g, err := hostgit.New(filepath.Join(filepath.Dir(drafts), "hostgit"))
	if err != nil {
		svc.log.Warn("drafts without git: behavior.diff and behavior.rebase are unavailable", "error", err)
	}
	o.git = g
	return o
}

// WithOwner makes every new draft's tree belong to uid:gid: the workers' uid, when the
// daemon runs as root and drops them to another (the agent edits its drafts in place).
func (o *Ops) WithOwner(uid, gid int) *Ops {
	o.uid, o.gid = uid, gid
	return o
}

func invalid(format string, a ...any) error {
	return &worker.RequestError{Code: "invalid", Message: fmt.Sprintf(format, a...)}
}

// HandleRequest implements worker.Handler.
func (o *Ops) HandleRequest(ctx context.Context, r worker.Request) (json.RawMessage, error) {
	session := workbench.SessionFrom(ctx)
	if session == "" {
		return nil, invalid("%s: no session", r.Op)
	}
	var res any
	var err error
	switch r.Op {
	case "behavior.status":
		res, err = o.status(ctx, session)
	case "behavior.draft":
		res, err = o.draft(ctx, session)
	case "behavior.publish":
		res, err = o.publish(ctx, session, r.Args)
	case "behavior.activate":
		res, err = o.activate(ctx, session, r.Args)
	case "behavior.rollback":
		res, err = o.svc.Rollback(ctx, session)
	case "behavior.diff":
		res, err = o.diff(ctx, r.Args)
	case "behavior.rebase":
		res, err = o.rebase(ctx, session, r.Args)
	case "hooks.list":
		res, err = o.hooksList(ctx, session)
	case "hooks.describe":
		res, err = o.hooksDescribe(r.Args)
	case "hooks.test":
		res, err = o.hooksTest(ctx, session, r.Args)
	case "hooks.trace":
		res, err = o.hooksTrace(ctx, session, r.Args)
	default:
		return nil, &worker.RequestError{Code: "unsupported", Message: r.Op + " is not a behavior or hooks operation"}
	}
	if err != nil {
		var re *worker.RequestError
		switch {
		case errors.As(err, &re):
		case errors.Is(err, ErrCandidate), errors.Is(err, behavior.ErrInvalidTree), errors.Is(err, behavior.ErrCorrupt):
			err = &worker.RequestError{Code: "refused", Message: err.Error()}
		case errors.Is(err, store.ErrStaleEpoch):
			err = &worker.RequestError{Code: "stale", Message: err.Error()}
		}
		return nil, err
	}
	return json.Marshal(res)
}

func (o *Ops) status(ctx context.Context, session string) (any, error) {
	sess, err := o.svc.store.Session(ctx, session)
	if err != nil {
		return nil, err
	}
	hist, err := o.svc.store.Activations(ctx, session)
	if err != nil {
		return nil, err
	}
	out := map[string]any{"epoch": sess.BehaviorEpoch, "release": sess.PolicyRevision, "history": hist}
	// The host's validation report of the active release, as stored with it.
	if v, err := o.svc.store.ReleaseValidation(ctx, session, sess.PolicyRevision); err == nil {
		out["validation"] = v.Report
	} else {
		out["validation"] = nil
	}
	if pin, ok := workbench.PinFrom(ctx); ok {
		// The behavior this cell runs under; it keeps it until it ends.
		out["cell_epoch"], out["cell_release"] = pin.Epoch, pin.Release
	}
	return out, nil
}

// draftRecord is <data>/drafts/<id>/draft.json.
type draftRecord struct {
	ID            string    `json:"draft"`
	Path          string    `json:"path"`
	Session       string    `json:"session"`
	ParentEpoch   int64     `json:"parent_epoch"`
	ParentRelease string    `json:"parent_release"`
	CreatedAt     time.Time `json:"created_at"`
	// Git says the draft can be diffed and rebased (false where git is
	// missing: diff and rebase then say so). Drafts made before git left
	// them have a .git in their tree, which nothing reads.
	Git bool `json:"git"`
}

// draft copies the active release's tree into a writable draft that records
// its parent epoch.
func (o *Ops) draft(ctx context.Context, session string) (any, error) {
	sess, err := o.svc.store.Session(ctx, session)
	if err != nil {
		return nil, err
	}
	if sess.PolicyRevision == "" {
		return nil, invalid("session %s has no active release to draft from", session)
	}
	b := make([]byte, 6)
	rand.Read(b)
	id := time.Now().UTC().Format("20060102T150405") + "-" + hex.EncodeToString(b)
	dir := filepath.Join(o.drafts, id)
	rec := draftRecord{ID: id, Path: filepath.Join(dir, "tree"), Session: session,
		ParentEpoch: sess.BehaviorEpoch, ParentRelease: sess.PolicyRevision, CreatedAt: time.Now()}
	if err := copyTree(o.svc.releases.Tree(sess.PolicyRevision), rec.Path); err != nil {
		return nil, fmt.Errorf("draft: %w", err)
	}
	rec.Git = o.git != nil
	if o.uid >= 0 {
		if err := filepath.WalkDir(rec.Path, func(p string, _ fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			return os.Lchown(p, o.uid, o.gid)
		}); err != nil {
			return nil, fmt.Errorf("draft: give it to the workers' uid: %w", err)
		}
	}
	if err := o.writeDraft(rec); err != nil {
		return nil, err
	}
	return rec, nil
}

func (o *Ops) writeDraft(rec draftRecord) error {
	j, _ := json.MarshalIndent(rec, "", "  ")
	// Beneath the drafts with no link followed: cells may write there.
	drafts, err := celltree.Open(o.drafts)
	if err != nil {
		return fmt.Errorf("draft: %w", err)
	}
	defer drafts.Close()
	if err := drafts.ReplaceFile(rec.ID+"/draft.json", j, 0o600); err != nil {
		return fmt.Errorf("draft: %w", err)
	}
	return nil
}

func (o *Ops) draftArg(args json.RawMessage, op string) (draftRecord, error) {
	var a struct {
		Draft string `json:"draft"`
	}
	if err := json.Unmarshal(args, &a); err != nil {
		return draftRecord{}, invalid("%s: %v", op, err)
	}
	rec, err := o.readDraft(a.Draft)
	if err == nil && o.git == nil {
		err = invalid("%s: draft %s cannot be diffed or rebased: %v", op, rec.ID, behavior.ErrNoGit)
	}
	if err == nil {
		// draft.json lies where cells may write: its release is checked,
		// not trusted as a path.
		if _, verr := o.svc.releases.Verify(rec.ParentRelease); verr != nil {
			err = invalid("%s: draft %s names no good parent release: %v", op, rec.ID, verr)
		}
	}
	return rec, err
}

// openDraft opens draft id's tree as an os.Root: nothing beneath it, a
// link the cell made included, leads the host outside it, and the tree
// itself is found beneath <data>/drafts the same way.
func (o *Ops) openDraft(id string) (*os.Root, error) {
	drafts, err := os.OpenRoot(o.drafts)
	if err != nil {
		return nil, fmt.Errorf("drafts: %w", err)
	}
	defer drafts.Close()
	root, err := drafts.OpenRoot(filepath.Join(id, "tree"))
	if err != nil {
		return nil, invalid("draft %s: its tree cannot be opened beneath %s: %v", id, o.drafts, err)
	}
	return root, nil
}

// diff is the draft's diff against the release it is based on.
func (o *Ops) diff(ctx context.Context, args json.RawMessage) (any, error) {
	rec, err := o.draftArg(args, "behavior.diff")
	if err != nil {
		return nil, err
	}
	root, err := o.openDraft(rec.ID)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	d, trunc, err := behavior.DraftDiff(ctx, o.git, root, o.svc.releases.Tree(rec.ParentRelease))
	if err != nil {
		return nil, fmt.Errorf("behavior.diff: %w", err)
	}
	return map[string]any{"draft": rec.ID, "parent_release": rec.ParentRelease, "diff": d, "truncated": trunc}, nil
}

// rebase brings a stale draft onto the session's current release,
// three-way; conflicts are reported and change nothing.
func (o *Ops) rebase(ctx context.Context, session string, args json.RawMessage) (any, error) {
	rec, err := o.draftArg(args, "behavior.rebase")
	if err != nil {
		return nil, err
	}
	sess, err := o.svc.store.Session(ctx, session)
	if err != nil {
		return nil, err
	}
	out := map[string]any{"draft": rec.ID, "from_release": rec.ParentRelease, "onto_release": sess.PolicyRevision}
	if rec.ParentRelease == sess.PolicyRevision {
		rec.ParentEpoch = sess.BehaviorEpoch
		out["rebased"], out["parent_epoch"], out["conflicts"] = true, rec.ParentEpoch, []behavior.Conflict{}
		return out, o.writeDraft(rec)
	}
	if _, err := o.svc.releases.Verify(sess.PolicyRevision); err != nil {
		return nil, fmt.Errorf("behavior.rebase: %w", err)
	}
	root, err := o.openDraft(rec.ID)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	res, err := behavior.Rebase(ctx, o.git, root, o.svc.releases.Tree(rec.ParentRelease), o.svc.releases.Tree(sess.PolicyRevision))
	if err != nil {
		return nil, fmt.Errorf("behavior.rebase: %w", err)
	}
	out["taken"], out["merged"], out["conflicts"] = res.Taken, res.Merged, res.Conflicts
	out["rebased"] = len(res.Conflicts) == 0
	if len(res.Conflicts) == 0 {
		rec.ParentEpoch, rec.ParentRelease = sess.BehaviorEpoch, sess.PolicyRevision
		if err := o.writeDraft(rec); err != nil {
			return nil, err
		}
	}
	out["parent_epoch"] = rec.ParentEpoch
	return out, nil
}

func (o *Ops) readDraft(id string) (draftRecord, error) {
	var rec draftRecord
	if id == "" || filepath.Base(id) != id || id[0] == '.' {
		return rec, invalid("%q is not a draft id", id)
	}
	// draft.json lies where a cell may write: read beneath the drafts
	// with no link followed, bounded, and its id is the one asked for.
	drafts, err := celltree.Open(o.drafts)
	if err != nil {
		return rec, fmt.Errorf("draft: %w", err)
	}
	defer drafts.Close()
	b, err := drafts.ReadFile(id+"/draft.json", maxDraftRecord)
	if err != nil {
		return rec, invalid("no draft %q", id)
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		return rec, invalid("draft %q: its draft.json does not parse: %v", id, err)
	}
	rec.ID, rec.Path = id, filepath.Join(o.drafts, id, "tree")
	return rec, nil
}

// maxDraftRecord bounds a draft.json read.
const maxDraftRecord = 64 << 10

func (o *Ops) publish(ctx context.Context, session string, args json.RawMessage) (any, error) {
	var a struct {
		Draft string `json:"draft"`
	}
	if err := json.Unmarshal(args, &a); err != nil {
		return nil, invalid("behavior.publish: %v", err)
	}
	rec, err := o.readDraft(a.Draft)
	if err != nil {
		return nil, err
	}
	// The draft is the cell's to write, also while it is read here (and
	// draft.json with it): its tree is found by id beneath the drafts, no
	// link on the way or in it is followed, no file read past the bound.
	drafts, err := celltree.Open(o.drafts)
	if err != nil {
		return nil, fmt.Errorf("behavior.publish: %w", err)
	}
	tree, err := drafts.OpenRoot(a.Draft + "/tree")
	drafts.Close()
	if err != nil {
		return nil, invalid("behavior.publish: draft %s: %v", a.Draft, err)
	}
	m, err := o.svc.releases.Publish(tree.FS(behavior.MaxFileBytes))
	tree.Close()
	if err != nil {
		return nil, err
	}
	if err := o.svc.Publish(ctx, m); err != nil {
		return nil, err
	}
	o.mu.Lock()
	o.parents[m.ID] = rec.ParentEpoch
	o.mu.Unlock()
	kind := behavior.KindWorkbench
	if parent, err := o.svc.releases.Verify(rec.ParentRelease); err == nil {
		kind = behavior.ActivationKind(parent.Components, m.Components)
	}
	return map[string]any{"release": m.ID, "kind": kind, "files": len(m.Files), "skills": m.Skills, "parent_epoch": rec.ParentEpoch}, nil
}

func (o *Ops) activate(ctx context.Context, session string, args json.RawMessage) (any, error) {
	var a struct {
		Release       string `json:"release"`
		ExpectedEpoch *int64 `json:"expected_epoch"`
		Reason        string `json:"reason"`
	}
	if err := json.Unmarshal(args, &a); err != nil {
		return nil, invalid("behavior.activate: %v", err)
	}
	id, err := o.svc.releases.Resolve(a.Release)
	if err != nil {
		return nil, invalid("behavior.activate: %v", err)
	}
	var parent int64
	switch {
	case a.ExpectedEpoch != nil:
		parent = *a.ExpectedEpoch
	default:
		o.mu.Lock()
		p, ok := o.parents[id]
		o.mu.Unlock()
		if ok {
			parent = p // a draft's release activates against the epoch it was drafted from
		} else {
			sess, err := o.svc.store.Session(ctx, session)
			if err != nil {
				return nil, err
			}
			parent = sess.BehaviorEpoch
		}
	}
	reason := a.Reason
	if reason == "" {
		reason = "activated from a cell"
	}
	res, err := o.svc.Activate(ctx, session, parent, id, reason)
	if err != nil {
		return nil, err
	}
	return map[string]any{"epoch": res.Epoch, "release": res.Release, "kind": res.Kind, "replaced": res.Replaced,
		"workbench_reset_pending": res.Kind == behavior.KindWorkbench}, nil
}

func (o *Ops) hooksList(ctx context.Context, session string) (any, error) {
	sess, err := o.svc.store.Session(ctx, session)
	if err != nil {
		return nil, err
	}
	b := o.svc.hooks.Binding(sess.PolicyRevision)
	type entry struct {
		hooks.Slot
		Handlers []string `json:"handlers"` // what the release binds, in order
		Required bool     `json:"required,omitempty"`
	}
	var slots []entry
	for _, s := range hooks.Slots() {
		e := entry{Slot: s, Handlers: []string{}, Required: !s.Optional || b.IsRequired(s.Name)}
		switch s.Kind {
		case hooks.KindTransform:
			e.Handlers = append(e.Handlers, b.Transforms[s.Name]...)
		case hooks.KindObserver:
			for _, ob := range b.Observers {
				if slices.Contains(ob.Events, s.Name) {
					e.Handlers = append(e.Handlers, ob.Handler)
				}
			}
		default:
			e.Handlers = append(e.Handlers, s.Name)
		}
		slots = append(slots, e)
	}
	return map[string]any{"release": sess.PolicyRevision, "epoch": sess.BehaviorEpoch, "slots": slots, "observers": b.Observers}, nil
}

func (o *Ops) hooksDescribe(args json.RawMessage) (any, error) {
	var a struct {
		Slot string `json:"slot"`
	}
	json.Unmarshal(args, &a)
	s, ok := hooks.Lookup(a.Slot)
	if !ok {
		return nil, invalid("unknown slot %q (slots: %s)", a.Slot, strings.Join(hooks.SlotNames(), ", "))
	}
	return map[string]any{"slot": s.Name, "kind": s.Kind, "doc": s.Doc, "input": s.Input, "output": s.Output,
		"deadline_ms": s.DeadlineMS, "failure": s.Failure, "default": s.Default, "optional": s.Optional,
		"example_input": s.Fixture, "contract": s.Input + " -> " + s.Output + "; " + s.Failure}, nil
}

// hooksTest invokes a slot in a fresh worker of the given (or active)
// release: a test never touches the session's live hook worker.
func (o *Ops) hooksTest(ctx context.Context, session string, args json.RawMessage) (any, error) {
	var a struct {
		Slot    string          `json:"slot"`
		Handler string          `json:"handler"`
		Input   json.RawMessage `json:"input"`
		Release string          `json:"release"`
	}
	if err := json.Unmarshal(args, &a); err != nil {
		return nil, invalid("hooks.test: %v", err)
	}
	handler := a.Slot
	if _, ok := hooks.Lookup(a.Slot); !ok {
		// A handler of a transform chain or an observer (a key of SLOTS)
		// may be tested by its own name.
		if a.Handler == "" {
			return nil, invalid("unknown slot %q (slots: %s)", a.Slot, strings.Join(hooks.SlotNames(), ", "))
		}
	}
	if a.Handler != "" {
		handler = a.Handler
	}
	rel := a.Release
	if pin, ok := workbench.PinFrom(ctx); ok && rel == "" {
		rel = pin.Release // a cell tests the behavior it runs under
	}
	if rel == "" {
		sess, err := o.svc.store.Session(ctx, session)
		if err != nil {
			return nil, err
		}
		rel = sess.PolicyRevision
	}
	id, err := o.svc.releases.Resolve(rel)
	if err != nil {
		return nil, invalid("hooks.test: %v", err)
	}
	w, err := o.svc.hooks.StartWorker(ctx, session, id)
	if err != nil {
		return map[string]any{"ok": false, "outcome": "unavailable", "error": err.Error()}, nil
	}
	defer w.Kill()
	start := time.Now()
	ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	out, err := w.Invoke(ictx, handler, a.Input)
	lat := float64(time.Since(start).Microseconds()) / 1000
	if err != nil {
		return map[string]any{"ok": false, "outcome": "error", "error": err.Error(), "latency_ms": lat}, nil
	}
	res := map[string]any{"ok": true, "outcome": "ok", "result": out, "latency_ms": lat, "effects": "fake"}
	if _, known := hooks.Lookup(a.Slot); known {
		// The host's own reading of the answer: what it would use or refuse.
		if verr := hooks.Validate(a.Slot, a.Input, out); verr != nil {
			res["valid"], res["invalid"] = false, verr.Error()
		} else {
			res["valid"] = true
		}
	}
	return res, nil
}

func (o *Ops) hooksTrace(ctx context.Context, session string, args json.RawMessage) (any, error) {
	var a struct {
		Limit  int  `json:"limit"`
		Inputs bool `json:"inputs"`
	}
	json.Unmarshal(args, &a)
	if a.Limit <= 0 || a.Limit > 500 {
		a.Limit = 20
	}
	// Newest first, each with its time, release, epoch, slot, latency,
	// outcome and the ref (digest) of its stored input; the records still
	// batched in memory are written first.
	o.svc.hooks.Flush()
	all, err := o.svc.store.HookTrace(ctx, session, a.Limit, a.Inputs)
	if err != nil {
		return nil, err
	}
	if all == nil {
		all = []store.TraceEntry{}
	}
	return map[string]any{"invocations": all}, nil
}

// copyTree copies a release tree into to, a new writable directory
// (its parent made here), with celltree like every tree copy of the host.
func copyTree(from, to string) error {
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		return err
	}
	_, err := celltree.Copy(from, to, celltree.Options{Writable: true, MaxEntries: behavior.MaxTreeFiles * 2, MaxBytes: behavior.MaxTreeBytes})
	return err
}
