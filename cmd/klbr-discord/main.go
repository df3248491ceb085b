// Command klbr-discord is klbr's Discord transport (internal/discord): it
// keeps the gateway, admits messages to klbr-core over ingress.sock, and
// performs the outbox's sends and reactions with honest receipts.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/klbr-dev/klbr/internal/discord"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// SIGHUP rereads klbr.toml's channel filter (systemctl reload klbr-discord).
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	code := discord.Main(ctx, os.Args[1:], os.LookupEnv, os.Stderr, hup)
	signal.Stop(hup)
	stop()
	os.Exit(code)
}
