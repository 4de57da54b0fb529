// Package health keeps the health of a node's GPUs from two sources: NVML's
// XID error events and a periodic NVML health check of every GPU.
//
//   - An XID that is not ignored (applications cause 13, 31, 43, 45, 68 and
//     109, ignored by default) makes its GPU unhealthy. An XID that names no
//     GPU makes every GPU unhealthy, as NVIDIA's own device plugin does.
//   - A failed health check (a GPU that fell off the bus, or any NVML error)
//     makes the GPU unhealthy.
//   - A sound health check makes an unhealthy GPU healthy again, once the
//     recovery delay after its last critical XID has passed.
//
// One GPU's state never changes another's, except for an XID without a GPU.
package health

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/deviceplugin/devices"
	"github.com/tessera-gpu/tessera/gpu"
)

// Checker is what the watcher needs from the GPU driver; gpu.Interface
// satisfies it.
type Checker interface {
	CheckHealth(index int) error
	WatchXIDs(ctx context.Context, out chan<- gpu.XIDEvent) error
}

var _ Checker = gpu.Interface(nil)

// GPU names one watched GPU.
type GPU struct {
	Index int
	UUID  string
}

// Options tune the watcher.
type Options struct {
	// IgnoredXIDs do not change a GPU's health.
	IgnoredXIDs []uint64
	// CheckInterval is the period of the health check (and the pause
	// before the XID watch is retried after a failure).
	CheckInterval time.Duration
	// RecoveryDelay is how long a GPU stays unhealthy after a critical XID.
	RecoveryDelay time.Duration
	// Now is the clock; time.Now when nil.
	Now func() time.Time
	// OnXID, when set, is told of every XID event and whether it was
	// ignored (for metrics).
	OnXID func(ev gpu.XIDEvent, ignored bool)
}

// State is one GPU's health with what led to it.
type State struct {
	devices.Health
	// LastXID is the time of the last critical XID, zero when none is
	// pending recovery.
	LastXID time.Time
}

// ApplyXID returns the state after a critical XID at now.
func ApplyXID(s State, xid uint64, now time.Time) State {
	return State{Health: devices.Health{Healthy: false, Reason: fmt.Sprintf("XID %d", xid)}, LastXID: now}
}

// ApplyCheck returns the state after a health check at now that returned
// err.
func ApplyCheck(s State, err error, now time.Time, recoveryDelay time.Duration) State {
	if err != nil {
		reason := "NVML health check failed: " + err.Error()
		if errors.Is(err, gpu.ErrGPULost) {
			reason = "GPU lost (fell off the bus)"
		}
		return State{Health: devices.Health{Healthy: false, Reason: reason}, LastXID: s.LastXID}
	}
	if s.Healthy {
		return s
	}
	if !s.LastXID.IsZero() && now.Sub(s.LastXID) < recoveryDelay {
		return s
	}
	return State{Health: devices.Health{Healthy: true}}
}

// Watcher tracks the health of a set of GPUs.
type Watcher struct {
	checker Checker
	gpus    []GPU
	opts    Options
	ignored map[uint64]bool
	byIndex map[int]string

	mu     sync.Mutex
	states map[string]State
}

// New returns a watcher of gpus; every GPU starts healthy.
func New(c Checker, gpus []GPU, opts Options) *Watcher {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.CheckInterval <= 0 {
		opts.CheckInterval = 30 * time.Second
	}
	w := &Watcher{checker: c, gpus: append([]GPU(nil), gpus...), opts: opts, ignored: map[uint64]bool{}, byIndex: map[int]string{}, states: map[string]State{}}
	for _, x := range opts.IgnoredXIDs {
		w.ignored[x] = true
	}
	for _, g := range gpus {
		w.byIndex[g.Index] = g.UUID
		w.states[g.UUID] = State{Health: devices.Health{Healthy: true}}
	}
	return w
}

// Health returns a snapshot of every GPU's health.
func (w *Watcher) Health() devices.HealthMap {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := devices.HealthMap{}
	for u, s := range w.states {
		out[u] = s.Health
	}
	return out
}

// Run checks every GPU now and then every CheckInterval, and applies XID
// events as they come, calling onChange (if set) with a snapshot whenever a
// GPU's health changes. It returns when ctx ends.
func (w *Watcher) Run(ctx context.Context, onChange func(devices.HealthMap)) error {
	events := make(chan gpu.XIDEvent, 64)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		w.watchXIDs(ctx, events)
	}()
	defer wg.Wait()

	notify := func(changed bool) {
		if changed && onChange != nil {
			onChange(w.Health())
		}
	}
	notify(w.CheckAll(ctx))
	ticker := time.NewTicker(w.opts.CheckInterval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ticker.C:
			notify(w.CheckAll(ctx))
		case ev := <-events:
			notify(w.HandleXID(ctx, ev))
		}
	}
}

// watchXIDs runs the checker's XID watch, restarting it after a failure.
func (w *Watcher) watchXIDs(ctx context.Context, out chan<- gpu.XIDEvent) {
	logger := klog.FromContext(ctx).WithName("health")
	for {
		err := w.checker.WatchXIDs(ctx, out)
		if ctx.Err() != nil {
			return
		}
		logger.Error(err, "Watching XID events failed; GPU health now rests on the periodic checks until the watch restarts", "retryIn", w.opts.CheckInterval)
		select {
		case <-ctx.Done():
			return
		case <-time.After(w.opts.CheckInterval):
		}
	}
}

// HandleXID applies one XID event and reports whether any GPU's health
// changed.
func (w *Watcher) HandleXID(ctx context.Context, ev gpu.XIDEvent) bool {
	logger := klog.FromContext(ctx).WithName("health")
	ignored := w.ignored[ev.XID]
	if w.opts.OnXID != nil {
		w.opts.OnXID(ev, ignored)
	}
	if ignored {
		logger.V(2).Info("Ignoring application XID", "xid", ev.XID, "gpu", ev.Index, "uuid", ev.UUID)
		return false
	}
	uuid := ev.UUID
	if uuid == "" && ev.Index >= 0 {
		uuid = w.byIndex[ev.Index]
	}
	now := w.opts.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	if uuid == "" {
		logger.Info("Critical XID without a GPU: marking every GPU unhealthy", "xid", ev.XID)
		for u, s := range w.states {
			w.states[u] = ApplyXID(s, ev.XID, now)
		}
		return true
	}
	s, ok := w.states[uuid]
	if !ok {
		logger.Info("Critical XID on a GPU that is not watched", "xid", ev.XID, "gpu", ev.Index, "uuid", uuid)
		return false
	}
	next := ApplyXID(s, ev.XID, now)
	w.states[uuid] = next
	logger.Info("GPU unhealthy after a critical XID", "xid", ev.XID, "gpu", ev.Index, "uuid", uuid, "recoveryDelay", w.opts.RecoveryDelay)
	return s.Health != next.Health
}

// CheckAll runs the health check of every GPU and reports whether any
// GPU's health changed.
func (w *Watcher) CheckAll(ctx context.Context) bool {
	logger := klog.FromContext(ctx).WithName("health")
	changed := false
	for _, g := range w.gpus {
		err := w.checker.CheckHealth(g.Index)
		now := w.opts.Now()
		w.mu.Lock()
		s := w.states[g.UUID]
		next := ApplyCheck(s, err, now, w.opts.RecoveryDelay)
		w.states[g.UUID] = next
		w.mu.Unlock()
		if s.Health == next.Health {
			continue
		}
		changed = true
		if next.Healthy {
			logger.Info("GPU healthy again", "gpu", g.Index, "uuid", g.UUID, "was", s.Reason)
		} else {
			logger.Info("GPU unhealthy", "gpu", g.Index, "uuid", g.UUID, "reason", next.Reason)
		}
	}
	return changed
}
