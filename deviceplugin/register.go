package deviceplugin

import (
	"context"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// registrar (re)starts the plugin servers and registers them whenever
// asked, retrying failed registrations with backoff until they succeed or a
// newer request comes.
func (a *Agent) registrar(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-a.registerNow:
		}
		a.registerAll(ctx)
	}
}

func (a *Agent) registerAll(ctx context.Context) {
	a.setRegistered(nil)
	// A (re)started kubelet knows none of the devices until the plugins'
	// ListAndWatch streams send them, and has not synced its pods until
	// it lists them (checkSynced): withhold every GPU till then.
	a.state.clearSent()
	a.state.unsync()
	go a.pollSynced(ctx)
	for _, p := range a.plugins {
		p.stop()
		if err := p.start(); err != nil {
			a.logger.Error(err, "Cannot serve the device plugin", "resource", p.resource)
			a.retryLater(ctx)
			return
		}
	}
	pending := append([]*plugin(nil), a.plugins...)
	backoff := 500 * time.Millisecond
	for len(pending) > 0 {
		var failed []*plugin
		for _, p := range pending {
			err := p.register(ctx, a.opts.KubeletSocket, a.opts.Dial)
			a.opts.Metrics.observeRegistration(p.resource, err)
			if err != nil {
				a.logger.Error(err, "Registration with the kubelet failed", "resource", p.resource, "retryIn", backoff)
				failed = append(failed, p)
				continue
			}
			a.setRegistered(p)
			a.logger.Info("Registered with the kubelet", "resource", p.resource, "endpoint", filepath.Base(p.socket))
		}
		pending = failed
		if len(pending) == 0 {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-a.registerNow:
			// The kubelet came back again: start over.
			poke(a.registerNow)
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 30*time.Second)
	}
}

// pollSynced reads the kubelet every syncedPoll until it has synced the
// node's pods (checkSynced) or ctx ends. A pod the kubelet never lists
// (a bug of ours or of the kubelet) must not keep the node's GPUs from
// every other pod: after syncedMaxWait the GPUs are offered, with an
// error in the log.
func (a *Agent) pollSynced(ctx context.Context) {
	t := time.NewTicker(syncedPoll)
	defer t.Stop()
	deadline := a.opts.Now().Add(syncedMaxWait)
	for !a.state.isSynced() {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if a.opts.Now().After(deadline) {
				a.logger.Error(nil, "The kubelet has not listed every running pod of the node; offering its GPUs anyway", "waited", syncedMaxWait)
				a.state.setSynced()
				return
			}
			poke(a.syncNow)
		}
	}
}

func (a *Agent) retryLater(ctx context.Context) {
	go func() {
		select {
		case <-ctx.Done():
		case <-time.After(5 * time.Second):
			poke(a.registerNow)
		}
	}()
}

func (a *Agent) setRegistered(p *plugin) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if p == nil {
		a.registered = map[corev1.ResourceName]bool{}
		return
	}
	a.registered[p.resource] = true
}
