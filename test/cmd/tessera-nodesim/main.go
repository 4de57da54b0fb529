// Command tessera-nodesim simulates one Kubernetes GPU node from real
// parts: the kubelet's device manager and topology manager, containerd's
// NRI runtime side, and the real tessera-node on a mock GPU machine (see
// package nodesim). It re-executes itself in a private mount namespace
// (needs root) so that it has its own /var/lib/kubelet/device-plugins.
//
//	tessera-nodesim --name n1 --profile dgx-a100 --kubeconfig KC \
//	    --state-dir DIR --agent bin/tessera-node
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/test/framework/kubelet"
	"github.com/tessera-gpu/tessera/test/framework/nodesim"
)

func main() {
	os.Exit(kubelet.RunMainInPrivateMountNamespace(run))
}

func run() int {
	var cfg nodesim.NodeConfig
	var labels, agentArgs string
	fs := flag.NewFlagSet("tessera-nodesim", flag.ContinueOnError)
	fs.StringVar(&cfg.Name, "name", "", "the Node's name (required)")
	fs.StringVar(&cfg.Profile, "profile", "dgx-a100", "built-in mock machine: dgx-a100, dgx-1v, pcie-2numa")
	fs.StringVar(&cfg.Kubeconfig, "kubeconfig", "", "kubeconfig of the API server for the node (required)")
	fs.StringVar(&cfg.AgentKubeconfig, "agent-kubeconfig", "", "tessera-node's kubeconfig (default --kubeconfig)")
	fs.StringVar(&cfg.StateDir, "state-dir", "", "the node's directory: agent log and state, pod records, control socket (required)")
	fs.StringVar(&cfg.AgentBinary, "agent", "bin/tessera-node", "the tessera-node binary")
	fs.StringVar(&agentArgs, "agent-args", "", "space-separated extra arguments of tessera-node")
	fs.StringVar(&cfg.TopologyPolicy, "topology-policy", "best-effort", "the topology manager's policy")
	fs.StringVar(&cfg.TopologyScope, "topology-scope", "container", "the topology manager's scope")
	fs.StringVar(&cfg.CPUManagerPolicy, "cpu-manager-policy", "none", "the CPU manager's policy: none or static (1 CPU reserved)")
	fs.StringVar(&labels, "labels", "", "comma-separated key=value labels of the Node")
	fs.Int64Var(&cfg.MaxPods, "max-pods", 256, "pods capacity")
	klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(klogFlags)
	klogFlags.VisitAll(func(f *flag.Flag) { fs.Var(f.Value, f.Name, f.Usage) })
	if err := fs.Parse(os.Args[1:]); err != nil {
		return 2
	}
	if cfg.Name == "" || cfg.Kubeconfig == "" || cfg.StateDir == "" {
		fmt.Fprintln(os.Stderr, "tessera-nodesim: --name, --kubeconfig and --state-dir are required")
		return 2
	}
	cfg.AgentArgs = strings.Fields(agentArgs)
	if labels != "" {
		cfg.Labels = map[string]string{}
		for _, kv := range strings.Split(labels, ",") {
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				fmt.Fprintf(os.Stderr, "tessera-nodesim: label %q is not key=value\n", kv)
				return 2
			}
			cfg.Labels[k] = v
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := nodesim.RunNode(ctx, cfg); err != nil {
		fmt.Fprintf(os.Stderr, "tessera-nodesim %s: %v\n", cfg.Name, err)
		return 1
	}
	return 0
}
