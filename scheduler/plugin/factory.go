package plugin

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sync"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"
	"k8s.io/utils/clock"

	"github.com/tessera-gpu/tessera/extender/app"
)

// Args are the plugin's arguments in a KubeSchedulerConfiguration:
//
//	pluginConfig:
//	- name: Tessera
//	  args:
//	    flags: ["--policy=binpack", "--listen=:8888"]
//
// Flags are tessera-extender's command-line flags (docs/extender.md): the
// extender runs in the scheduler's process with them, serving its
// webhooks, /status and /metrics on --listen as it would alone, and the
// plugin calls it instead of its verbs. Every profile must give the same
// flags: there is one extender per process.
type Args struct {
	Flags []string `json:"flags,omitempty"`
}

// RunFunc runs the extender until ctx ends (app.Run).
type RunFunc func(ctx context.Context, args []string, stderr io.Writer, embed func(app.Embedded)) error

// Runner starts the one extender of the process on the first profile's
// plugin and hands it to every profile's plugin.
type Runner struct {
	run    RunFunc
	stderr io.Writer
	// fatal ends the process when the extender stops on its own.
	fatal func(error)

	mu      sync.Mutex
	started bool
	flags   []string
	emb     app.Embedded
}

// NewRunner returns a Runner of run (app.Run); fatal is called when the
// extender stops before the scheduler's context ends.
func NewRunner(run RunFunc, stderr io.Writer, fatal func(error)) *Runner {
	return &Runner{run: run, stderr: stderr, fatal: fatal}
}

// Factory builds the plugin of one profile (a frameworkruntime.PluginFactory).
func (r *Runner) Factory(ctx context.Context, obj runtime.Object, h framework.Handle) (framework.Plugin, error) {
	var args Args
	if obj != nil {
		if err := frameworkruntime.DecodeInto(obj, &args); err != nil {
			return nil, fmt.Errorf("%s args: %w", Name, err)
		}
	}
	emb, err := r.start(ctx, args.Flags)
	if err != nil {
		return nil, err
	}
	return New(emb.Server, emb.Trust, emb.Ready, h, clock.RealClock{}), nil
}

func (r *Runner) start(ctx context.Context, flags []string) (app.Embedded, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.started {
		if !slices.Equal(flags, r.flags) {
			return app.Embedded{}, fmt.Errorf("%s args: every profile must give the same flags (one extender runs per process): %q, then %q", Name, r.flags, flags)
		}
		return r.emb, nil
	}
	got := make(chan app.Embedded, 1)
	done := make(chan error, 1)
	go func() {
		done <- r.run(ctx, flags, r.stderr, func(e app.Embedded) { got <- e })
	}()
	select {
	case e := <-got:
		r.started, r.flags, r.emb = true, slices.Clone(flags), e
		go func() {
			err := <-done
			if ctx.Err() != nil {
				return
			}
			if err == nil {
				err = fmt.Errorf("stopped")
			}
			klog.FromContext(ctx).Error(err, "Tessera's extender stopped")
			r.fatal(fmt.Errorf("tessera extender: %w", err))
		}()
		return e, nil
	case err := <-done:
		if err == nil {
			err = fmt.Errorf("stopped before it started")
		}
		return app.Embedded{}, fmt.Errorf("%s: extender: %w", Name, err)
	}
}
