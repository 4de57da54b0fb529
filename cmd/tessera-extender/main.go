// Command tessera-extender is Tessera's kube-scheduler extender: an HTTP(S)
// webhook answering the filter, prioritize, bind and preempt verbs for pods
// that ask for tessera.dev/gpu, tessera.dev/gpu-memory or
// tessera.dev/gpu-core. See docs/extender.md.
//
//	tessera-extender [--kubeconfig FILE] [--listen :8888] [--policy binpack]
//	                 [--tls-cert FILE --tls-key FILE] [--metrics-listen ADDR]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/tessera-gpu/tessera/extender/app"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := app.Run(ctx, os.Args[1:], os.Stderr, nil)
	stop()
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintf(os.Stderr, "tessera-extender: %v\n", err)
		}
		os.Exit(1)
	}
}
