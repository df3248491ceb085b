package cli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/klbr-dev/klbr/internal/admission"
	"github.com/klbr-dev/klbr/internal/api"
	"github.com/klbr-dev/klbr/internal/localclient"
)

func newSend(g *globals) *cobra.Command {
	return newSendLike(g, false)
}

// newMaintain is send with the maintenance flag: the turn that attends the
// goal carries the maintenance skill.
func newMaintain(g *globals) *cobra.Command {
	return newSendLike(g, true)
}

func newSendLike(g *globals, maintenance bool) *cobra.Command {
	var asJSON bool
	var key string
	use, short := "send SESSION TEXT", "Send an operator input; prints its id once it is committed (TEXT - reads stdin)"
	if maintenance {
		use, short = "maintain SESSION GOAL", "Send a maintenance goal: the turn attending it carries the maintenance skill (GOAL - reads stdin)"
	}
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			text := args[1]
			if text == "-" {
				b, err := io.ReadAll(io.LimitReader(g.env.Stdin, admission.MaxBodyBytes+1))
				if err != nil {
					return fmt.Errorf("read stdin: %w", err)
				}
				text = string(b)
			}
			if key == "" {
				key = newSourceKey()
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			res, err := c.Send(cmd.Context(), args[0], api.SendRequest{Text: text, SourceKey: key, Maintenance: maintenance})
			if err != nil {
				return sendError(err, key, args[0])
			}
			if asJSON {
				return printJSON(g.env.Stdout, res)
			}
			fmt.Fprintln(g.env.Stdout, res.ID)
			if res.Duplicate {
				fmt.Fprintf(g.env.Stderr, "input %d was already admitted under key %s; nothing new was stored\n", res.ID, key)
			}
			if res.Unanswered != "" {
				fmt.Fprintln(g.env.Stderr, res.Unanswered)
			} else if st, err := statusBriefly(cmd.Context(), c); err == nil {
				for _, w := range nobodyAnswers(st, args[0]) {
					fmt.Fprintln(g.env.Stderr, w)
				}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the receipt as JSON")
	cmd.Flags().StringVar(&key, "key", "", "idempotency key: resending with the same key returns the original input (default: a new random key)")
	return cmd
}

// nobodyAnswers says why an admitted input will not be answered now, as the
// browser's banner does: the agent does not run (no route, no cells), or the
// session is held at a spend cap.
func nobodyAnswers(st api.Status, session string) []string {
	var out []string
	if why, ok := strings.CutPrefix(st.Agent, "not running: "); ok {
		out = append(out, "nobody will answer: the agent is not running ("+why+")")
	}
	if _, seed, ok := strings.Cut(st.Agent, " — no route configured: "); ok {
		// The seed's default routes are in force: whether anything answers
		// there is the operator's to check.
		seed = strings.TrimPrefix(seed, "using seed defaults ")
		out = append(out, "no route configured: it answers only if an OpenAI-compatible server runs at "+seed+
			"; `klbr-core doctor` checks whether one answers")
	}
	if st.Spend != nil {
		for _, h := range st.Spend.Held {
			if h.Session == session {
				out = append(out, fmt.Sprintf("nobody will answer until %s: session %s is held at the %s spend cap; the input is kept (klbr-core spend shows the caps)",
					h.Resets.Local().Format("2006-01-02 15:04"), session, h.Cap))
			}
		}
	}
	return out
}

// statusBriefly reads the daemon's status for a warning: the input is
// already stored, so a slow status costs the warning, never the send.
func statusBriefly(ctx context.Context, c *localclient.Client) (api.Status, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	return c.Status(ctx)
}

// sendError says what a failed send means for the input: not stored (nothing reached
// the daemon, or it answered a refusal), or not known (the request went out and no answer
// came back: the daemon may have committed it and died). Whenever a retry could be wanted,
// it names the key, with which a retry is a duplicate, not a second input.
func sendError(err error, key, session string) error {
	retry := fmt.Sprintf("retry with the same key, which stores it at most once: klbr-core send --key %s %s TEXT", key, session)
	var ae *localclient.Error
	var oe *net.OpError
	switch {
	case errors.As(err, &ae) && ae.Status >= 500:
		return fmt.Errorf("send: %w; %s", err, retry)
	case errors.As(err, &ae):
		return err // a refusal: the daemon says why, and nothing was stored
	case errors.As(err, &oe) && oe.Op == "dial":
		return fmt.Errorf("send: not stored: %w", err)
	}
	return fmt.Errorf("send: cannot tell whether the input was stored (%w); %s", err, retry)
}

func newSourceKey() string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		panic(errors.New("crypto/rand failed")) // never on Linux ≥ 3.17
	}
	return "cli:" + hex.EncodeToString(b)
}
