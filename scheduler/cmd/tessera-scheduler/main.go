// Command tessera-scheduler is kube-scheduler v1.34 with Tessera's plugin
// (scheduler/plugin) compiled in: Tessera's extender runs in the
// scheduler's process and its decisions are plugin calls, not HTTP verbs
// carrying every node's name. It takes kube-scheduler's flags; the
// plugin's arguments (pluginConfig, name Tessera) carry the extender's.
// See docs/extender.md, "In-process plugin".
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"

	extenderapp "github.com/tessera-gpu/tessera/extender/app"
	"github.com/tessera-gpu/tessera/scheduler/plugin"
)

func main() {
	r := plugin.NewRunner(extenderapp.Run, os.Stderr, func(err error) {
		klog.ErrorS(err, "Exiting")
		klog.FlushAndExit(klog.ExitFlushTimeout, 1)
	})
	os.Exit(cli.Run(app.NewSchedulerCommand(app.WithPlugin(plugin.Name, r.Factory))))
}
