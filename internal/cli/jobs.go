package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/klbr-dev/klbr/internal/api"
	"github.com/klbr-dev/klbr/internal/localclient"
	"github.com/klbr-dev/klbr/internal/store"
)

func newJobs(g *globals) *cobra.Command {
	var asJSON bool
	var state string
	var limit int
	cmd := &cobra.Command{
		Use:   "jobs [SESSION]",
		Short: "List durable jobs (commands, routines, sources), newest first",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			session := ""
			if len(args) == 1 {
				session = args[0]
			}
			res, err := c.Jobs(cmd.Context(), session, state, limit)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(g.env.Stdout, res)
			}
			if len(res.Jobs) == 0 {
				fmt.Fprintln(g.env.Stderr, "no jobs")
				return nil
			}
			fmt.Fprintln(g.env.Stdout, jobHeader)
			for _, j := range res.Jobs {
				fmt.Fprintln(g.env.Stdout, jobLine(j))
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print as JSON")
	cmd.Flags().StringVar(&state, "state", "", "only jobs in this state: pending, running, succeeded, failed, cancelled or unknown")
	cmd.Flags().IntVar(&limit, "limit", 100, "at most this many jobs (1..1000)")
	cmd.AddCommand(newJobsShow(g), newJobsCancel(g))
	return cmd
}

func jobID(s string) (int64, error) {
	id, err := strconv.ParseInt(strings.TrimPrefix(s, "#"), 10, 64)
	if err != nil || id < 1 {
		return 0, fmt.Errorf("%q is not a job id", s)
	}
	return id, nil
}

func newJobsShow(g *globals) *cobra.Command {
	return jobCommand(g, "show ID", "Show one job: its spec, state, result or error, and output preview",
		(*localclient.Client).Job, func(j store.Job) { printJob(g, j) })
}

func newJobsCancel(g *globals) *cobra.Command {
	return jobCommand(g, "cancel ID", "Cancel a job; a running one's whole process tree is killed",
		(*localclient.Client).CancelJob, func(j store.Job) { fmt.Fprintln(g.env.Stdout, jobLine(j)) })
}

// jobCommand is a command on one job by its id: it asks the daemon with
// call and prints the job it answers (as JSON with --json).
func jobCommand(g *globals, use, short string, call func(*localclient.Client, context.Context, int64) (store.Job, error), show func(store.Job)) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := jobID(args[0])
			if err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			j, err := call(c, cmd.Context(), id)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(g.env.Stdout, j)
			}
			show(j)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print as JSON")
	return cmd
}

// jobLineFormat lays out jobLine; jobHeader names its columns.
const jobLineFormat = "%-6v %-8s %-10s %-10s %-10s %-19s  %s  %s"

var jobHeader = strings.TrimRight(fmt.Sprintf(jobLineFormat, "ID", "KIND", "STATE", "SESSION", "WHERE", "WHEN", "WHAT", "NOTE"), " ")

func jobLine(j store.Job) string {
	when := j.CreatedAt
	if j.FinishedAt != nil {
		when = *j.FinishedAt
	}
	extra := ""
	switch {
	case j.State == store.JobPending && j.NextDue != nil:
		extra = "due " + j.NextDue.Local().Format(time.DateTime)
	case j.Error != "":
		extra = oneLine(j.Error, 60)
	}
	return strings.TrimRight(fmt.Sprintf(jobLineFormat, j.ID, j.Kind, j.State, j.Session, jobWhere(j), when.Local().Format(time.DateTime), jobWhat(j), extra), " ")
}

// jobWhere says where a job runs: the worker host its attempt was sent to,
// else the host (or "label:L") its spec asks for, for a job not placed yet,
// else "here" (klbr-core's machine).
func jobWhere(j store.Job) string {
	if j.Host != "" {
		return j.Host
	}
	var spec struct {
		Host      string `json:"host"`
		Workspace struct {
			Host string `json:"host"`
		} `json:"workspace"`
	}
	if json.Unmarshal(j.Spec, &spec) == nil {
		switch {
		case spec.Host != "":
			return oneLine(spec.Host, 40)
		case spec.Workspace.Host != "":
			return oneLine(spec.Workspace.Host, 40)
		}
	}
	return "here"
}

func jobWhat(j store.Job) string {
	return oneLine(plainJSON(j.Spec), 60)
}

// plainJSON is raw JSON as a person reads it: Go's encoder writes <, > and &
// inside strings as \u003c, \u003e and \u0026 (safe in HTML, unreadable in a
// terminal); they are shown as the characters they are. Other escapes stay.
func plainJSON(raw []byte) string {
	var b strings.Builder
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		if c != '\\' || i+1 >= len(raw) {
			b.WriteByte(c)
			continue
		}
		if raw[i+1] == 'u' && i+6 <= len(raw) {
			switch string(raw[i+2 : i+6]) {
			case "003c", "003C":
				b.WriteByte('<')
				i += 5
				continue
			case "003e", "003E":
				b.WriteByte('>')
				i += 5
				continue
			case "0026":
				b.WriteByte('&')
				i += 5
				continue
			}
		}
		b.WriteByte(c) // any other escape: both bytes as they are
		b.WriteByte(raw[i+1])
		i++
	}
	return b.String()
}

func oneLine(s string, max int) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if len(s) > max {
		s = strings.ToValidUTF8(s[:max], "") + "…"
	}
	return s
}

func printJob(g *globals, j store.Job) {
	w := g.env.Stdout
	fmt.Fprintf(w, "job %d: %s, %s (session %s, recovery %s, runs %d)\n", j.ID, j.Kind, j.State, j.Session, j.Recovery, j.Runs)
	if where := jobWhere(j); where != "here" {
		fmt.Fprintf(w, "host: %s\n", where)
	}
	fmt.Fprintf(w, "spec: %s\n", plainJSON(j.Spec))
	if j.Schedule != nil {
		fmt.Fprintf(w, "schedule: %s (tz %s)\n", plainJSON(j.Schedule), j.TZ)
	}
	if j.NextDue != nil {
		fmt.Fprintf(w, "next: %s\n", j.NextDue.Local().Format(time.RFC3339))
	}
	if j.Release != "" {
		fmt.Fprintf(w, "release: %s\n", j.Release)
	}
	fmt.Fprintf(w, "created: %s\n", j.CreatedAt.Local().Format(time.RFC3339))
	if j.StartedAt != nil {
		fmt.Fprintf(w, "started: %s\n", j.StartedAt.Local().Format(time.RFC3339))
	}
	if j.FinishedAt != nil {
		fmt.Fprintf(w, "finished: %s\n", j.FinishedAt.Local().Format(time.RFC3339))
	}
	if j.Result != nil {
		fmt.Fprintf(w, "result: %s\n", plainJSON(j.Result))
	}
	if j.Error != "" {
		fmt.Fprintf(w, "error: %s\n", j.Error)
	}
	if j.Checkpoint != nil {
		fmt.Fprintf(w, "checkpoint: %s\n", plainJSON(j.Checkpoint))
	}
	if j.Cursor != nil {
		fmt.Fprintf(w, "cursor: %s\n", plainJSON(j.Cursor))
	}
	if j.OutputArtifact != "" {
		fmt.Fprintf(w, "output: %d bytes in %s (klbr-core history read %s)\n", j.OutputBytes, j.OutputArtifact, j.OutputArtifact)
	}
	if j.OutputPreview != "" {
		fmt.Fprintf(w, "output tail:\n%s\n", j.OutputPreview)
	}
}

func printJobsStatus(g *globals, js *api.JobsStatus) {
	if js == nil {
		return
	}
	w := g.env.Stdout
	next := "none scheduled"
	if js.NextWakeup != nil {
		next = js.NextWakeup.Local().Format(time.DateTime)
	}
	fmt.Fprintf(w, "jobs: %d running · next wakeup %s\n", len(js.Running), next)
	for _, j := range js.Running {
		fmt.Fprintf(w, "  %s\n", jobLine(j))
	}
	for _, h := range js.Hosts {
		switch {
		case !h.Known:
			fmt.Fprintf(w, "host %s: not contacted since the start · jobs %d/%d\n", h.Name, h.Reserved, h.MaxJobs)
		case h.Up:
			fmt.Fprintf(w, "host %s: up · jobs %d/%d\n", h.Name, h.Reserved, h.MaxJobs)
		default:
			since := ""
			if h.DownSince != nil {
				since = " since " + h.DownSince.Local().Format(time.DateTime)
			}
			fmt.Fprintf(w, "host %s: DOWN%s: %s · jobs %d/%d (its running jobs wait for it; see each job)\n", h.Name, since, oneLine(h.LastErr, 200), h.Reserved, h.MaxJobs)
		}
	}
}
