package cli

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/klbr-dev/klbr/internal/api"
	"github.com/klbr-dev/klbr/internal/localclient"
	"github.com/klbr-dev/klbr/internal/store"
)

func newDrain(g *globals) *cobra.Command {
	var noWait bool
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "drain [SESSION]",
		Short: "Close admission, let accepted work finish, then stop the session (or, without one, the daemon)",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return shutdownOrMove(cmd.Context(), g, args, noWait, timeout,
				(*localclient.Client).DrainSession, (*localclient.Client).Drain)
		},
	}
	cmd.Flags().BoolVar(&noWait, "no-wait", false, "return once the daemon accepted, without waiting for it to exit")
	cmd.Flags().DurationVar(&timeout, "timeout", 2*time.Minute, "how long to wait for the daemon to exit")
	return cmd
}

func newStop(g *globals) *cobra.Command {
	var noWait bool
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "stop [SESSION]",
		Short: "Stop a session now, or, without one, interrupt running work and stop the daemon",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return shutdownOrMove(cmd.Context(), g, args, noWait, timeout,
				(*localclient.Client).StopSession, (*localclient.Client).Stop)
		},
	}
	cmd.Flags().BoolVar(&noWait, "no-wait", false, "return once the daemon accepted, without waiting for it to exit")
	cmd.Flags().DurationVar(&timeout, "timeout", 2*time.Minute, "how long to wait for the daemon to exit")
	return cmd
}

func newStart(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "start SESSION",
		Short: "Make a stopped session ready again",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			s, err := c.StartSession(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			fmt.Fprintf(g.env.Stdout, "session %s is %s\n", s.ID, s.State)
			return nil
		},
	}
}

type sessionMove func(*localclient.Client, context.Context, string) (store.Session, error)
type daemonShutdown func(*localclient.Client, context.Context) (api.Accepted, error)

func shutdownOrMove(ctx context.Context, g *globals, args []string, noWait bool, timeout time.Duration, move sessionMove, shutdown daemonShutdown) error {
	c, err := g.client()
	if err != nil {
		return err
	}
	defer c.Close()
	if len(args) == 1 {
		s, err := move(c, ctx, args[0])
		if err != nil {
			return err
		}
		fmt.Fprintf(g.env.Stdout, "session %s is %s\n", s.ID, s.State)
		return nil
	}
	before, err := c.Status(ctx)
	if err != nil {
		return err
	}
	acc, err := shutdown(c, ctx)
	if err != nil {
		return err
	}
	fmt.Fprintln(g.env.Stderr, acc.Message)
	if noWait {
		return nil
	}
	if err := waitGone(ctx, c, before.PID, timeout); err != nil {
		return err
	}
	fmt.Fprintln(g.env.Stderr, "klbr-core has exited")
	return nil
}

// waitGone polls until the daemon with pid no longer answers on its socket.
// Under socket activation the poll itself may start a new daemon: an answer
// from another pid also means this one has exited.
func waitGone(ctx context.Context, c *localclient.Client, pid int, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		c.Close() // no kept-alive connection may hide the daemon's exit
		st, err := c.Status(ctx)
		if errors.Is(err, localclient.ErrUnreachable) || (err == nil && st.PID != pid) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("klbr-core has not exited after %s; see its log (journalctl -u klbr-core)", timeout)
		case <-tick.C:
		}
	}
}
