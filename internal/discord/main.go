package discord

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/klbr-dev/klbr/internal/config"
	"github.com/klbr-dev/klbr/internal/secretfile"
)

// MaxTokenBytes bounds the token file.
const MaxTokenBytes = 4096

// Main is klbr-discord: it reads klbr.toml's [discord] section and the token
// (token_file, else $CREDENTIALS_DIRECTORY/discord-token; never argv or the
// environment), and runs the transport until ctx ends. It returns the exit
// code: 0 on a stop, 1 on a configuration error, 2 on a fatal gateway close.
// Each value on hup (SIGHUP; nil: none) rereads klbr.toml and puts its
// [discord] channels, ingest and include_bots in force; what needs a
// restart (the token, api_base, attachment limits) is named in the log.
func Main(ctx context.Context, args []string, lookup func(string) (string, bool), stderr io.Writer, hup <-chan os.Signal) int {
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	if len(args) > 0 {
		fmt.Fprintln(stderr, "klbr-discord takes no arguments: it reads klbr.toml's [discord] section, and the token from a file (see docs/discord.md)")
		return 1
	}
	cfg, err := config.Load(lookup)
	if err != nil {
		fmt.Fprintln(stderr, "klbr-discord:", err)
		return 1
	}
	d := cfg.File.Discord
	token, err := readToken(d.TokenFile, lookup)
	if err != nil {
		fmt.Fprintln(stderr, "klbr-discord:", err)
		return 1
	}
	log.Info("starting", "api_base", d.APIBase, "ingress_socket", cfg.Paths.IngressSocket, "ingest", d.Ingest,
		"include_bots", d.IncludeBots, "channels", len(d.Channels),
		"intents", "guilds, guild messages, direct messages, message content (privileged: enable it in the Developer Portal)")
	filters := make(chan Filter, 1)
	go reloadFilters(ctx, hup, lookup, d, filters, log)
	err = Run(ctx, Config{Token: token, APIBase: d.APIBase, IngressSocket: cfg.Paths.IngressSocket, Channels: d.Channels,
		Directed: d.Ingest == config.IngestDirected, IncludeBots: d.IncludeBots, Log: log, Filters: filters,
		Fetch: FetchLimits{MaxBytes: d.AttachmentMaxBytes, Timeout: time.Duration(d.AttachmentTimeoutSeconds) * time.Second,
			Concurrency: d.AttachmentConcurrency, BytesPerHour: d.AttachmentBytesPerHour, BytesPerSecond: unpacedIfZero(d.AttachmentBytesPerSecond)},
		Flood:    FloodLimits{AuthorBurst: d.AuthorBurst, AuthorPerMinute: d.AuthorPerMinute, ChannelBurst: d.ChannelBurst, ChannelPerMinute: d.ChannelPerMinute},
		Operator: d.OperatorUserID})
	var fe *FatalError
	if errors.As(err, &fe) {
		log.Error("stopping: the gateway refused this bot for good", "close_code", fe.Code, "error", fe.Msg)
		return 2
	}
	if err != nil {
		log.Error("stopping", "error", err)
		return 1
	}
	log.Info("stopped")
	return 0
}

// reloadFilters rereads klbr.toml at each hup and sends its channel filter
// to the transport (the newest replaces one not taken yet); a file that
// does not load is refused and the filter in force stays.
func reloadFilters(ctx context.Context, hup <-chan os.Signal, lookup func(string) (string, bool), started config.Discord, out chan Filter, log *slog.Logger) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
		}
		cfg, err := config.Load(lookup)
		if err != nil {
			log.Error("reload refused: klbr.toml does not load; the channel filter in force stays", "error", err)
			continue
		}
		d := cfg.File.Discord
		f := Filter{Channels: d.Channels, Directed: d.Ingest == config.IngestDirected, IncludeBots: d.IncludeBots}
		select {
		case <-out: // not taken yet: the newer one replaces it
		default:
		}
		out <- f
		var restart []string
		if d.TokenFile != started.TokenFile {
			restart = append(restart, "discord.token_file")
		}
		if d.APIBase != started.APIBase {
			restart = append(restart, "discord.api_base")
		}
		if d.AttachmentMaxBytes != started.AttachmentMaxBytes || d.AttachmentTimeoutSeconds != started.AttachmentTimeoutSeconds ||
			d.AttachmentConcurrency != started.AttachmentConcurrency || d.AttachmentBytesPerHour != started.AttachmentBytesPerHour ||
			d.AttachmentBytesPerSecond != started.AttachmentBytesPerSecond {
			restart = append(restart, "discord.attachment_*")
		}
		log.Info("klbr.toml reloaded: the channel filter applies from the next gateway event", "channels", len(f.Channels),
			"ingest", d.Ingest, "include_bots", d.IncludeBots, "needs_restart", restart)
	}
}

// readToken reads the bot token from path, or the systemd credential.
func readToken(path string, lookup func(string) (string, bool)) (string, error) {
	if path == "" {
		dir, _ := lookup("CREDENTIALS_DIRECTORY")
		if dir == "" {
			return "", errors.New("no token: set discord.token_file in klbr.toml, or run under systemd with LoadCredential=discord-token:/path")
		}
		path = filepath.Join(dir, "discord-token")
	}
	b, err := secretfile.Read(path, MaxTokenBytes)
	if err != nil {
		return "", fmt.Errorf("token file %s: %w", path, err)
	}
	token := strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(string(b)), "Bot "))
	if token == "" || strings.ContainsAny(token, " \n\r\t") {
		return "", fmt.Errorf("token file %s does not hold one bot token", path)
	}
	return token, nil
}

// unpacedIfZero maps attachment_bytes_per_second = 0 (unpaced) to
// FetchLimits' negative.
func unpacedIfZero(n int64) int64 {
	if n == 0 {
		return -1
	}
	return n
}
