package cli

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/klbr-dev/klbr/internal/admission"
	"github.com/klbr-dev/klbr/internal/api"
)

func newSend(g *globals) *cobra.Command {
	var asJSON bool
	var key string
	cmd := &cobra.Command{
		Use:   "send SESSION TEXT",
		Short: "Send an operator input; prints its id once it is committed (TEXT - reads stdin)",
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
			res, err := c.Send(cmd.Context(), args[0], api.SendRequest{Text: text, SourceKey: key})
			if err != nil {
				return err
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
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the receipt as JSON")
	cmd.Flags().StringVar(&key, "key", "", "idempotency key: resending with the same key returns the original input (default: a new random key)")
	return cmd
}

func newSourceKey() string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		panic(errors.New("crypto/rand failed")) // never on Linux ≥ 3.17
	}
	return "cli:" + hex.EncodeToString(b)
}
