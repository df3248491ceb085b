// Command klbr-core is klbr's host daemon and the operator's tool.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/klbr-dev/klbr/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	err := cli.Run(ctx, os.Args[1:], cli.OSEnv())
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "klbr-core:", err)
		os.Exit(1)
	}
}
