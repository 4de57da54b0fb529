package nodesim

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/nri/pkg/adaptation"
)

// runtime is the container runtime's side of NRI (containerd/nri's
// pkg/adaptation, as containerd embeds it) on a private socket. It keeps
// the sandboxes and containers it "runs", which it hands to every plugin
// that (re)connects in Synchronize, as containerd does.
type runtime struct {
	*adaptation.Adaptation
	plugins atomic.Int32

	mu         sync.Mutex
	sandboxes  map[string]*adaptation.PodSandbox
	containers map[string]*adaptation.Container
}

// pluginMetrics tracks the number of connected (synchronized) plugins.
type pluginMetrics struct{ r *runtime }

func (pluginMetrics) RecordPluginInvocation(string, string, error)      {}
func (pluginMetrics) RecordPluginLatency(string, string, time.Duration) {}
func (pluginMetrics) RecordPluginAdjustments(string, string, *adaptation.ContainerAdjustment, int, int) {
}
func (m pluginMetrics) UpdatePluginCount(n int) { m.r.plugins.Store(int32(n)) }

func startRuntime(dir string) (*runtime, error) {
	r := &runtime{sandboxes: map[string]*adaptation.PodSandbox{}, containers: map[string]*adaptation.Container{}}
	syncFn := func(ctx context.Context, cb adaptation.SyncCB) error {
		pods, ctrs := r.snapshot()
		_, err := cb(ctx, pods, ctrs)
		return err
	}
	updateFn := func(context.Context, []*adaptation.ContainerUpdate) ([]*adaptation.ContainerUpdate, error) {
		return nil, nil
	}
	for _, d := range []string{"nri-plugins", "nri-conf"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return nil, err
		}
	}
	sock := filepath.Join(dir, "nri.sock")
	_ = os.Remove(sock)
	a, err := adaptation.New("containerd", "v2.1.0", syncFn, updateFn,
		adaptation.WithSocketPath(sock),
		adaptation.WithPluginPath(filepath.Join(dir, "nri-plugins")),
		adaptation.WithPluginConfigPath(filepath.Join(dir, "nri-conf")),
		adaptation.WithMetrics(pluginMetrics{r}),
	)
	if err != nil {
		return nil, fmt.Errorf("NRI runtime side: %w", err)
	}
	if err := a.Start(); err != nil {
		return nil, fmt.Errorf("NRI runtime side: %w", err)
	}
	r.Adaptation = a
	return r, nil
}

func (r *runtime) socket(dir string) string { return filepath.Join(dir, "nri.sock") }

func (r *runtime) snapshot() ([]*adaptation.PodSandbox, []*adaptation.Container) {
	r.mu.Lock()
	defer r.mu.Unlock()
	pods := make([]*adaptation.PodSandbox, 0, len(r.sandboxes))
	for _, p := range r.sandboxes {
		pods = append(pods, p)
	}
	ctrs := make([]*adaptation.Container, 0, len(r.containers))
	for _, c := range r.containers {
		ctrs = append(ctrs, c)
	}
	return pods, ctrs
}

func (r *runtime) addSandbox(sb *adaptation.PodSandbox) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sandboxes[sb.Id] = sb
}

func (r *runtime) removeSandbox(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.sandboxes, id)
}

func (r *runtime) addContainer(c *adaptation.Container) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.containers[c.Id] = c
}

func (r *runtime) removeContainer(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.containers, id)
}

// waitPlugin waits until at least one plugin is synchronized.
func (r *runtime) waitPlugin(ctx context.Context, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for r.plugins.Load() < 1 {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
	return true
}
