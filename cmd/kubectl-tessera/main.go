// Command kubectl-tessera is the kubectl plugin of Tessera (kubectl finds
// it on PATH as `kubectl tessera`). It reads the cluster with the user's
// kubeconfig and never writes. See docs/kubectl-tessera.md.
//
//	kubectl tessera status              per node, per GPU: free, whole, shared
//	kubectl tessera explain POD         why a pod waits, or where it runs
//	kubectl tessera queues              per Queue: guarantee, limit, use, share
//
// Global flags are kubectl's (--kubeconfig, --context, -n, ...), plus
// --extender to reach tessera-extender's read-only /status endpoints.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/api"
)

const usage = `kubectl tessera: Tessera's view of GPUs, queues and pending pods (read-only).

Usage:
  kubectl tessera status               per node, per GPU: free, whole with its pod, shared with memory and compute
  kubectl tessera explain POD          why POD (in -n NAMESPACE) is pending, or where it runs
  kubectl tessera queues               per Queue: guarantee, limit, use, fair share, share, borrowing

Flags:
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		if !errors.Is(err, pflag.ErrHelp) {
			fmt.Fprintf(os.Stderr, "kubectl tessera: %v\n", err)
		}
		os.Exit(1)
	}
}

// options are the plugin's own flags.
type options struct {
	extender         string
	extenderCA       string
	extenderInsecure bool
	extenderService  string
	sealKeyNamespace string
}

// run is main without the process around it.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := pflag.NewFlagSet("kubectl-tessera", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usage)
		fs.PrintDefaults()
	}
	loading := clientcmd.NewDefaultClientConfigLoadingRules()
	fs.StringVar(&loading.ExplicitPath, "kubeconfig", "", "path to the kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")
	overrides := &clientcmd.ConfigOverrides{}
	clientcmd.BindOverrideFlags(overrides, fs, clientcmd.RecommendedConfigOverrideFlags(""))
	o := &options{}
	fs.StringVar(&o.extender, "extender", os.Getenv(api.EnvKubectlExtender), "tessera-extender's base URL (e.g. https://10.0.0.5:8888) for its /status endpoints (default $"+api.EnvKubectlExtender+"); empty: through the API server's service proxy to --extender-service; \"none\": do not ask it")
	fs.StringVar(&o.extenderCA, "extender-ca", os.Getenv(api.EnvKubectlExtenderCA), "CA certificate file that signed --extender's certificate (default $"+api.EnvKubectlExtenderCA+")")
	fs.BoolVar(&o.extenderInsecure, "extender-insecure-skip-tls-verify", false, "do not check --extender's certificate")
	fs.StringVar(&o.extenderService, "extender-service", "kube-system/tessera-extender:8888", "the extender's Service (namespace/name:port, optionally https:namespace/name:port) reached through the API server's proxy when --extender is empty")
	fs.StringVar(&o.sealKeyNamespace, "seal-key-namespace", "kube-system", "namespace of tessera-extender's Secret tessera-seal-key, with which the plugin checks that an assignment is Tessera's, and of its ConfigMap tessera-reservations (status shows the reservations)")
	fs.SetInterspersed(true)
	if err := fs.Parse(args); err != nil {
		return err
	}
	rest := fs.Args()
	if len(rest) == 0 {
		fs.Usage()
		return errors.New("no subcommand: one of status, explain, queues")
	}
	cmd, cmdArgs := rest[0], rest[1:]
	switch cmd {
	case "status", "queues":
		if len(cmdArgs) != 0 {
			return fmt.Errorf("%s takes no arguments, got %q", cmd, cmdArgs)
		}
	case "explain":
		if len(cmdArgs) != 1 {
			return fmt.Errorf("explain takes one pod name (in -n NAMESPACE or NAMESPACE/NAME), got %q", cmdArgs)
		}
	case "help":
		fs.Usage()
		return nil
	default:
		fs.Usage()
		return fmt.Errorf("unknown subcommand %q: one of status, explain, queues", cmd)
	}

	// Each API request is bounded by kubectl's --request-timeout; the
	// whole command by a minute.
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	ctx = klog.NewContext(ctx, klog.Background().WithName("kubectl-tessera"))

	config := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(loading, overrides)
	cfg, err := config.ClientConfig()
	if err != nil {
		return fmt.Errorf("kubeconfig: %w (check --kubeconfig, $KUBECONFIG and --context)", err)
	}
	cfg.UserAgent = "kubectl-tessera"
	namespace, _, err := config.Namespace()
	if err != nil {
		return fmt.Errorf("kubeconfig: namespace: %w", err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("dynamic client: %w", err)
	}
	e := &env{client: client, dyn: dyn, server: cfg.Host, sealKeyNamespace: o.sealKeyNamespace, now: time.Now, stderr: stderr}
	if e.ext, err = newExtenderClient(o, client); err != nil {
		return err
	}
	switch cmd {
	case "status":
		return e.status(ctx, stdout)
	case "queues":
		return e.queues(ctx, stdout)
	}
	pod := cmdArgs[0]
	if ns, name, ok := strings.Cut(pod, "/"); ok {
		namespace, pod = ns, name
	}
	return e.explain(ctx, stdout, namespace, pod)
}
