// Command tessera-node is Tessera's node agent.
//
//	tessera-node topology --nvml=mock:dgx-a100 [--sysfs-root DIR]
//
// prints the node's GPU topology model as JSON.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintf(os.Stderr, "tessera-node: %v\n", err)
		}
		os.Exit(1)
	}
}

const usage = `usage: tessera-node COMMAND [flags]

Commands:
  topology   print the node's GPU topology model as JSON
  agent      serve the kubelet device plugins (the default when flags come first)
`

// run dispatches a command line; it is main without the process around it.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return errors.New("no command given")
	}
	switch args[0] {
	case "topology":
		return runTopology(ctx, args[1:], stdout, stderr)
	case agentCommand(args[0]):
		return runAgent(ctx, args, stdout, stderr)
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	fmt.Fprint(stderr, usage)
	return fmt.Errorf("unknown command %q", args[0])
}
