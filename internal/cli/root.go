// Package cli is klbr-core's command line: thin cobra commands that parse,
// call the typed operator client or a domain function, and print. Answers go
// to stdout, diagnostics to stderr.
package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/klbr-dev/klbr/internal/config"
	"github.com/klbr-dev/klbr/internal/localclient"
	"github.com/klbr-dev/klbr/internal/version"
)

// Env is what the commands take from the process: its streams and environment.
type Env struct {
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
	Lookup func(string) (string, bool)
}

// Run executes klbr-core with args (without the program name).
func Run(ctx context.Context, args []string, env Env) error {
	root := newRoot(env)
	root.SetArgs(args)
	root.SetIn(env.Stdin)
	root.SetOut(env.Stdout)
	root.SetErr(env.Stderr)
	return root.ExecuteContext(ctx)
}

type globals struct {
	env      Env
	logLevel string
}

func newRoot(env Env) *cobra.Command {
	g := &globals{env: env}
	serve := newServe(g)
	root := &cobra.Command{
		Use:   "klbr-core",
		Short: "klbr's host: state, sessions, and the operator's tool",
		Long: "klbr-core owns klbr's state and serves the agent. Without a subcommand it serves.\n" +
			"Configuration comes from KLBR_* environment variables and KLBR_CONFIG (default <data>/klbr.toml).",
		Version:       version.Version,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE:          serve.RunE,
	}
	// cobra suggests a command only when the root takes arguments; klbr-core
	// takes none, so an unknown word is answered here, with the near ones.
	root.SuggestionsMinimumDistance = 2
	root.Args = func(cmd *cobra.Command, args []string) error {
		if len(args) == 0 {
			return nil
		}
		msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
		if near := cmd.SuggestionsFor(args[0]); len(near) > 0 {
			msg += "\n\nDid you mean this?\n\t" + strings.Join(near, "\n\t")
		}
		return errors.New(msg + "\n\nRun 'klbr-core --help' for the commands.")
	}
	root.PersistentFlags().StringVar(&g.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	root.AddCommand(newInit(g), newDoctor(g), serve, newStatus(g), newSend(g), newMaintain(g), newTail(g),
		newDrain(g), newStop(g), newStart(g), newExec(g), newReset(g), newCompact(g), newHistory(g), newItems(g), newMark(g), newHeld(g), newDecide(g, true), newDecide(g, false), newReleases(g), newPublish(g), newActivate(g), newRollback(g), newOpen(g), newRoute(g), newJobs(g), newHosts(g), newSessions(g),
		newBackup(g), newRestore(g), newCheck(g), newGC(g), newImport(g), newHooks(g), newSpend(g), newReload(g))
	return root
}

// logger configures slog once, for this invocation.
func (g *globals) logger() (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(g.logLevel)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	return slog.New(slog.NewTextHandler(g.env.Stderr, &slog.HandlerOptions{Level: level})), nil
}

// config loads the whole configuration, file included.
func (g *globals) config() (*config.Config, error) {
	return config.Load(g.env.Lookup)
}

// client returns the operator API client for the configured control socket.
func (g *globals) client() (*localclient.Client, error) {
	paths, err := config.LoadPaths(g.env.Lookup)
	if err != nil {
		return nil, err
	}
	return localclient.New(paths.ControlSocket), nil
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// OSEnv is the real process environment.
func OSEnv() Env {
	return Env{Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr, Lookup: os.LookupEnv}
}
