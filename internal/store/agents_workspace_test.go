package store

import (
	"strings"
	"testing"
)

// A child's task says where it works and what is enforced, per mode.
func TestChildWorkspaceText(t *testing.T) {
	for _, c := range []struct {
		w    *ChildWorkspace
		want []string
	}{
		{nil, nil},
		{&ChildWorkspace{Mode: WorkspaceShared, Dir: "/ws"}, []string{"/ws, is shared with your parent", "edits are theirs at once"}},
		{&ChildWorkspace{Mode: WorkspaceWorktree, Kind: "git", Dir: "/d/w/x", Branch: "klbr/x", Base: "0123456789abcdef"}, []string{"git repository of its own, /d/w/x, on branch klbr/x (from 0123456789ab)"}},
		{&ChildWorkspace{Mode: WorkspaceWorktree, Kind: "copy", Dir: "/d/w/x", Root: "/ws"}, []string{"a copy of its own, /d/w/x, of /ws"}},
		{&ChildWorkspace{Mode: WorkspaceReadOnly, Dir: "/ws", ReadOnly: true, Enforced: "NOT enforced: landlock: disabled"}, []string{"READ-ONLY to you", "Enforced: NOT enforced: landlock: disabled."}},
	} {
		got := ChildWorkspaceText(c.w)
		if c.w == nil && got != "" {
			t.Fatalf("no workspace: %q", got)
		}
		for _, w := range c.want {
			if !strings.Contains(got, w) {
				t.Errorf("%+v: %q lacks %q", c.w, got, w)
			}
		}
	}
}
