package doctor

import (
	"context"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	behaviortree "github.com/klbr-dev/klbr/behavior"
	"github.com/klbr-dev/klbr/internal/behavior"
	"github.com/klbr-dev/klbr/internal/config"
	"github.com/klbr-dev/klbr/internal/store"
)

// checkSkills lists the skill ids and klbr_skills modules a new session is
// offered (the default behavior tree with the managed skills of
// <data>/skills), and every refusal with its reason. A refusal is a
// warning: the other skills are offered.
func checkSkills(paths config.Paths, add func(Check)) {
	var src fs.FS = behaviortree.Tree()
	from := "the embedded default release"
	if paths.BehaviorDir != "" {
		src, from = os.DirFS(paths.BehaviorDir), paths.BehaviorDir
	}
	tmp, err := os.MkdirTemp("", "klbr-doctor-")
	if err != nil {
		add(Check{Name: "skills", Detail: err.Error()})
		return
	}
	defer os.RemoveAll(tmp)
	if err := os.CopyFS(tmp, src); err != nil {
		add(Check{Name: "skills", Detail: fmt.Sprintf("read %s: %v", from, err)})
		return
	}
	set, err := behavior.LoadSkills(behavior.SkillRoots(tmp, paths.SkillsDir, paths.DataDir))
	if err != nil {
		fix := "check the permissions of " + filepath.Join(paths.DataDir, "skills")
		if paths.SkillsDir != "" {
			fix += " and of " + paths.SkillsDir + " (KLBR_SKILLS_DIR)"
		}
		add(Check{Name: "skills", Detail: err.Error(), Fix: fix})
		return
	}
	add(Check{Name: "skills", OK: true, Detail: describeSkills(set, from, paths.SkillsDir) + " (a session's own release: below)"})
	ids := make([]string, 0, len(set.Refused))
	for id := range set.Refused {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		add(Check{Name: "skill " + id, OK: true, Warn: true, Detail: "refused: " + set.Refused[id],
			Fix: "fix or remove one definition; an id offered twice is offered by neither"})
	}
}

func describeSkills(set behavior.SkillSet, from, skillsDir string) string {
	ids := make([]string, 0, len(set.Skills))
	for id := range set.Skills {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	mods := make([]string, 0, len(set.Modules))
	for m := range set.Modules {
		mods = append(mods, "klbr_skills."+m)
	}
	sort.Strings(mods)
	d := fmt.Sprintf("%d offered (%s and managed): %s", len(ids), from, strings.Join(ids, ", "))
	if skillsDir != "" {
		d = fmt.Sprintf("%d offered (%s, KLBR_SKILLS_DIR %s and managed): %s", len(ids), from, skillsDir, strings.Join(ids, ", "))
	}
	if len(mods) > 0 {
		d += "; modules: " + strings.Join(mods, ", ")
	}
	if len(set.Refused) > 0 {
		d += fmt.Sprintf("; %d refused", len(set.Refused))
	}
	return d
}

// checkReleaseSkills lists, for each release a session has active, the
// skills it offers with the managed ones: what that session's agent sees.
// A data directory not initialized yet has none.
func checkReleaseSkills(ctx context.Context, paths config.Paths, add func(Check)) {
	st, err := store.OpenReader(ctx, paths.DataDir)
	if err != nil {
		return // checkDataDir says why
	}
	defer st.Close()
	sessions, err := st.Sessions(ctx)
	if err != nil {
		add(Check{Name: "skills", Detail: "read the sessions: " + err.Error(), Fix: "run `klbr-core check`"})
		return
	}
	by := map[string][]string{} // release -> its sessions
	for _, s := range sessions {
		if s.PolicyRevision != "" {
			by[s.PolicyRevision] = append(by[s.PolicyRevision], s.ID)
		}
	}
	for _, id := range slices.Sorted(maps.Keys(by)) {
		ss := by[id]
		who := strings.Join(ss[:min(len(ss), 4)], ", ")
		if len(ss) > 4 {
			who += fmt.Sprintf(" and %d more", len(ss)-4)
		}
		tree := filepath.Join(paths.DataDir, "releases", id, "tree")
		set, err := behavior.LoadSkills(behavior.SkillRoots(tree, paths.SkillsDir, paths.DataDir))
		if err != nil {
			add(Check{Name: "skills", OK: true, Warn: true, Detail: fmt.Sprintf("release %.12s (session %s): %v", id, who, err),
				Fix: "run `klbr-core check`: it verifies the releases"})
			continue
		}
		add(Check{Name: "skills", OK: true, Detail: fmt.Sprintf("release %.12s (session %s): %s", id, who, describeSkills(set, "the release", paths.SkillsDir))})
	}
}
