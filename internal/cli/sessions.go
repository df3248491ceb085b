package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/spf13/cobra"

	"github.com/klbr-dev/klbr/internal/api"
	"github.com/klbr-dev/klbr/internal/localclient"
	"github.com/klbr-dev/klbr/internal/store"
)

// SessionNode is one session of the tree `klbr-core sessions` prints: a
// child carries its job (state, budget, result) and what its model
// requests used.
type SessionNode struct {
	store.Session
	Job      *store.Job     `json:"job,omitempty"`
	Usage    *store.Usage   `json:"usage,omitempty"`
	Children []*SessionNode `json:"children,omitempty"`
}

func newSessions(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "sessions",
		Short: "List the sessions as a tree: each child agent under its parent, with its state, job and result",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			st, err := c.Status(cmd.Context())
			if err != nil {
				return err
			}
			js, err := c.Jobs(cmd.Context(), "", "", 1000)
			if err != nil {
				return err
			}
			roots := SessionTree(st.Sessions, js.Jobs)
			if err := addUsage(cmd.Context(), c, roots); err != nil {
				return err
			}
			if asJSON {
				return printJSON(g.env.Stdout, roots)
			}
			for _, r := range roots {
				printNode(g.env.Stdout, r, 0)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print as JSON")
	return cmd
}

// SessionTree arranges sessions by parent; a child's job is found by the
// session its spec names.
func SessionTree(sessions []api.SessionStatus, jobs []store.Job) []*SessionNode {
	byJob := map[string]*store.Job{}
	for i := range jobs {
		if spec, err := store.ChildSpecOf(jobs[i]); err == nil {
			byJob[spec.Session] = &jobs[i]
		}
	}
	nodes := map[string]*SessionNode{}
	for _, s := range sessions {
		nodes[s.ID] = &SessionNode{Session: s.Session, Job: byJob[s.ID]}
	}
	var roots []*SessionNode
	for _, s := range sessions {
		n := nodes[s.ID]
		if p := nodes[s.ParentID]; p != nil {
			p.Children = append(p.Children, n)
		} else {
			roots = append(roots, n)
		}
	}
	return roots
}

// addUsage reads the usage of every child in the tree (a child the daemon
// does not know, or a daemon without usage, prints without it).
func addUsage(ctx context.Context, c *localclient.Client, nodes []*SessionNode) error {
	for _, n := range nodes {
		if n.Job != nil {
			u, err := c.Usage(ctx, n.ID)
			var e *localclient.Error
			switch {
			case errors.As(err, &e) && e.Status == http.StatusNotFound:
			case err != nil:
				return err
			default:
				n.Usage = &u
			}
		}
		if err := addUsage(ctx, c, n.Children); err != nil {
			return err
		}
	}
	return nil
}

func printNode(w io.Writer, n *SessionNode, depth int) {
	line := fmt.Sprintf("%s%s  %s", strings.Repeat("  ", depth), n.ID, n.State)
	if j := n.Job; j != nil {
		line += fmt.Sprintf("  job %d %s", j.ID, j.State)
		if where := jobWhere(*j); where != "here" {
			line += " on host " + where
		}
		if j.Error != "" {
			line += ": " + j.Error
		}
		if u := n.Usage; u != nil {
			line += fmt.Sprintf("  used %d tokens, %d model requests", u.Tokens, u.ModelRequests)
			// Its budget covers its whole subtree: say what that used.
			if all := subtreeUsage(n); len(n.Children) > 0 && (all.Tokens != u.Tokens || all.ModelRequests != u.ModelRequests) {
				line += fmt.Sprintf(" (%d tokens, %d model requests with its children)", all.Tokens, all.ModelRequests)
			}
		}
		if spec, err := store.ChildSpecOf(*j); err == nil && len(spec.Delegate) > 0 {
			line += "  speaks " + strings.Join(spec.Delegate, ",")
		}
		if b := compactJSON(j.Budget); b != "" && b != "null" && b != "{}" {
			line += "  budget " + clipLine(b, 120)
		}
		if len(j.Result) > 0 {
			line += "  result " + clipLine(compactJSON(j.Result), 120)
		}
	}
	fmt.Fprintln(w, line)
	for _, c := range n.Children {
		printNode(w, c, depth+1)
	}
}

// subtreeUsage sums the usage of n and every session under it (what n's
// budget bounds, if n is a child).
func subtreeUsage(n *SessionNode) store.Usage {
	var u store.Usage
	if n.Usage != nil {
		u.Tokens, u.ModelRequests = n.Usage.Tokens, n.Usage.ModelRequests
	}
	for _, c := range n.Children {
		cu := subtreeUsage(c)
		u.Tokens += cu.Tokens
		u.ModelRequests += cu.ModelRequests
	}
	return u
}

func compactJSON(b json.RawMessage) string {
	var compact bytes.Buffer
	if json.Compact(&compact, b) == nil {
		return compact.String()
	}
	return string(b)
}

func clipLine(s string, n int) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n]) + "…"
	}
	return s
}
