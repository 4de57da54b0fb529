package deviceplugin

import (
	"context"
	"maps"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/deviceplugin/devices"
)

// state is the agent's live view: the GPUs' health, what the kubelet has
// allocated, and what the agent allocated that the kubelet has not reported
// yet. Every change recomputes the device lists and wakes the ListAndWatch
// streams whose list changed.
type state struct {
	model   *devices.Model
	kinds   []Kind
	grace   time.Duration
	now     func() time.Time
	metrics *Metrics
	logger  klog.Logger

	mu      sync.Mutex
	health  devices.HealthMap
	kubelet []devices.Allocation
	pending []pending
	// assigned are the GPUs the shared parts of the assignments of the
	// node's pods name (see devices.Usage.Assigned).
	assigned map[string]bool
	// runWhole and runShared are the GPUs the containers that exist in
	// the runtime use whole and shared (the NRI plugin's ledger; see
	// RuntimeUse).
	runWhole, runShared map[string]bool
	usage               devices.Usage
	lists               map[corev1.ResourceName][]devices.Device
	changed             map[corev1.ResourceName]chan struct{}
	// sent is, per resource, the last device list a ListAndWatch stream
	// sent to the kubelet (markSent); absent until one was sent.
	sent map[corev1.ResourceName][]devices.Device
	// sentBy is, per resource, the ListAndWatch stream that sent sent[r].
	sentBy map[corev1.ResourceName]uint64
	// stopping is set when the agent stops: every GPU is withheld.
	stopping bool
	// unsynced is set from a (re)registration until the kubelet lists
	// the node's running pods (Agent.checkSynced): every GPU is withheld.
	unsynced bool
	// onChange, when set, is called (under mu; it must not block or take
	// mu) when a device list changes or one was sent: the inventory's
	// withheld lists may have changed.
	onChange func()
}

// pending is an allocation the agent answered that the kubelet has not
// reported yet.
type pending struct {
	devices.Allocation
	at time.Time
}

func newState(logger klog.Logger, model *devices.Model, kinds []Kind, grace time.Duration, now func() time.Time, metrics *Metrics) *state {
	s := &state{
		model:   model,
		kinds:   kinds,
		grace:   grace,
		now:     now,
		metrics: metrics,
		logger:  logger,
		health:  devices.HealthMap{},
		lists:   map[corev1.ResourceName][]devices.Device{},
		changed: map[corev1.ResourceName]chan struct{}{},
		sent:    map[corev1.ResourceName][]devices.Device{},
		sentBy:  map[corev1.ResourceName]uint64{},
	}
	for _, k := range kinds {
		s.changed[k.Resource()] = make(chan struct{})
	}
	s.mu.Lock()
	s.recomputeLocked()
	s.mu.Unlock()
	return s
}

// devices returns resource r's device list and a channel that is closed when
// it changes.
func (s *state) devices(r corev1.ResourceName) ([]devices.Device, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lists[r], s.changed[r]
}

// snapshot returns the health and usage now.
func (s *state) snapshot() (devices.HealthMap, devices.Usage) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.health, s.usage
}

func (s *state) setHealth(h devices.HealthMap) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.health = h
	s.recomputeLocked()
}

// setKubelet replaces what the kubelet has allocated. Pending allocations
// that the kubelet now reports are settled: from here on the kubelet's
// record carries them.
func (s *state) setKubelet(allocs []devices.Allocation) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.kubelet = allocs
	held := map[corev1.ResourceName]map[string]bool{}
	for _, a := range allocs {
		if held[a.Resource] == nil {
			held[a.Resource] = map[string]bool{}
		}
		for _, id := range a.DeviceIDs {
			held[a.Resource][id] = true
		}
	}
	s.pending = slices.DeleteFunc(s.pending, func(p pending) bool {
		for _, id := range p.DeviceIDs {
			if !held[p.Resource][id] {
				return false
			}
		}
		return true
	})
	s.recomputeLocked()
}

// setAssigned replaces the GPUs that the shared assignments of the node's
// pods name.
func (s *state) setAssigned(gpus map[string]bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.assigned = gpus
	s.recomputeLocked()
}

// setRuntime replaces the GPUs the runtime's containers use whole and
// shared.
func (s *state) setRuntime(whole, shared map[string]bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if maps.Equal(s.runWhole, whole) && maps.Equal(s.runShared, shared) {
		return
	}
	s.runWhole, s.runShared = whole, shared
	s.recomputeLocked()
}

// expire drops pending allocations older than the grace period.
func (s *state) expire() {
	s.mu.Lock()
	defer s.mu.Unlock()
	cutoff := s.now().Add(-s.grace)
	n := len(s.pending)
	s.pending = slices.DeleteFunc(s.pending, func(p pending) bool { return p.at.Before(cutoff) })
	if len(s.pending) != n {
		s.logger.V(2).Info("Pending allocations expired without the kubelet reporting them", "expired", n-len(s.pending))
		s.recomputeLocked()
	}
}

// allocate runs check under the state lock and, when it succeeds, records
// allocs as pending, so no other allocation can slip in between the check
// and the record.
func (s *state) allocate(check func(devices.HealthMap, devices.Usage) ([]devices.Allocation, error)) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	allocs, err := check(s.health, s.usage)
	if err != nil {
		return err
	}
	now := s.now()
	for _, a := range allocs {
		// The same devices allocated again (a container restarted, the
		// kubelet re-allocating after a restart) refresh the entry.
		i := slices.IndexFunc(s.pending, func(p pending) bool {
			return p.Resource == a.Resource && p.SharedGPU == a.SharedGPU && slices.Equal(p.DeviceIDs, a.DeviceIDs)
		})
		if i >= 0 {
			s.pending[i].at = now
			continue
		}
		s.pending = append(s.pending, pending{Allocation: a, at: now})
	}
	s.recomputeLocked()
	return nil
}

// recomputeLocked derives usage and device lists and wakes the streams of
// the resources whose list changed.
func (s *state) recomputeLocked() {
	all := append([]devices.Allocation(nil), s.kubelet...)
	for _, p := range s.pending {
		all = append(all, p.Allocation)
	}
	usage, errs := s.model.UsageOf(all)
	for _, err := range errs {
		s.logger.Error(err, "Ignoring an allocation of a device this node does not have")
	}
	usage.Assigned = map[string]bool{}
	for _, use := range []struct{ from, into map[string]bool }{
		{s.assigned, usage.Assigned}, {s.runWhole, usage.Whole}, {s.runShared, usage.Shared},
	} {
		for uuid, ok := range use.from {
			if _, known := s.model.GPU(uuid); ok && known {
				use.into[uuid] = true
			}
		}
	}
	s.usage = usage
	for _, k := range s.kinds {
		r := k.Resource()
		next := kindDevices(k, s.health, usage)
		prev := s.lists[r]
		if slices.Equal(prev, next) {
			continue
		}
		s.logChanges(r, prev, next)
		s.lists[r] = next
		close(s.changed[r])
		s.changed[r] = make(chan struct{})
		s.metrics.setDevices(r, next, s.health)
		if s.onChange != nil {
			s.onChange()
		}
	}
	s.metrics.setGPUHealth(s.model.GPUs(), s.health)
}

// clearSent forgets every list sent: the kubelet (re)started, and knows
// the devices only once the ListAndWatch streams send them again.
func (s *state) clearSent() {
	s.mu.Lock()
	defer s.mu.Unlock()
	clear(s.sent)
	clear(s.sentBy)
	if s.onChange != nil {
		s.onChange()
	}
}

// unsync makes inventoryView withhold every GPU until setSynced.
func (s *state) unsync() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.unsynced = true
	if s.onChange != nil {
		s.onChange()
	}
}

// setSynced ends unsync's withholding.
func (s *state) setSynced() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.unsynced {
		return
	}
	s.unsynced = false
	if s.onChange != nil {
		s.onChange()
	}
}

func (s *state) isSynced() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.unsynced
}

// stop makes inventoryView withhold every GPU from both kinds: the agent
// is stopping.
func (s *state) stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopping = true
}

// markSent records that ListAndWatch stream sent list, resource r's
// device list, to the kubelet: the Send returned.
func (s *state) markSent(r corev1.ResourceName, list []devices.Device, stream uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sent[r], s.sentBy[r] = list, stream
	if s.onChange != nil {
		s.onChange()
	}
}

// streamEnded records that ListAndWatch stream ended: when it is the one
// that sent r's last list, the kubelet is gone (stopped, restarting) and
// knows nothing of r until a new stream sends again, so every GPU is
// withheld from r's kind meanwhile: a pod bound to the node now would be
// admitted by a restarted kubelet before the plugins registered again, and
// refused ("no healthy devices present").
func (s *state) streamEnded(r corev1.ResourceName, stream uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if by, ok := s.sentBy[r]; !ok || by != stream {
		return // a newer stream has sent since
	}
	delete(s.sent, r)
	delete(s.sentBy, r)
	if s.onChange != nil {
		s.onChange()
	}
}

// inventoryView returns the GPUs' health and the UUIDs of the healthy GPUs
// whose devices the node withholds from whole use and from shared use, in
// the model's GPU order, for the inventory annotation. A GPU counts as
// withheld from a kind while any of the kind's device lists, the one the
// agent computes now or the last one sent to the kubelet, reports its
// devices unhealthy. So a new withholding is published at once (before the
// kubelet hears of it: the extender only gets more careful), and a
// release only once the list that offers the GPU again has been sent to
// the kubelet: markSent runs after ListAndWatch's Send returned, and the
// kubelet reads that message from its stream long before a pod the
// extender binds after seeing the published inventory reaches its
// admission (an API write, an informer event, a scheduling cycle, a
// Binding and the kubelet's pod watch later).
func (s *state) inventoryView() (h devices.HealthMap, whole, shared []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fromWhole, fromShared := map[string]bool{}, map[string]bool{}
	for _, k := range s.kinds {
		if _, ok := k.(Withholder); !ok {
			continue
		}
		into := fromWhole
		if _, ok := k.(SharedKind); ok {
			into = fromShared
		}
		r := k.Resource()
		if _, sent := s.sent[r]; !sent || s.stopping || s.unsynced {
			// The kubelet has none of r's devices from this agent yet, has
			// not synced the node's pods, or the agent is stopping.
			for _, g := range s.model.GPUs() {
				if s.health.Of(g.UUID).Healthy {
					into[g.UUID] = true
				}
			}
			continue
		}
		for _, list := range [][]devices.Device{s.lists[r], s.sent[r]} {
			for _, d := range list {
				if !d.Healthy && s.health.Of(d.GPU).Healthy {
					into[d.GPU] = true
				}
			}
		}
	}
	for _, g := range s.model.GPUs() {
		if fromWhole[g.UUID] {
			whole = append(whole, g.UUID)
		}
		if fromShared[g.UUID] {
			shared = append(shared, g.UUID)
		}
	}
	return s.health, whole, shared
}

// logChanges logs, per GPU, when its devices of resource r turn unhealthy
// (with the reason) or healthy.
func (s *state) logChanges(r corev1.ResourceName, prev, next []devices.Device) {
	type gpuState struct {
		healthy bool
		reason  string
	}
	before := map[string]gpuState{}
	for _, d := range prev {
		before[d.GPU] = gpuState{d.Healthy, d.Reason}
	}
	logged := map[string]bool{}
	for _, d := range next {
		if logged[d.GPU] {
			continue
		}
		logged[d.GPU] = true
		b, known := before[d.GPU]
		if known && b == (gpuState{d.Healthy, d.Reason}) {
			continue
		}
		if !known && d.Healthy {
			continue
		}
		g, _ := s.model.GPU(d.GPU)
		if d.Healthy {
			s.logger.Info("Reporting the GPU's devices healthy", "resource", r, "gpu", g.Index, "uuid", g.UUID)
		} else {
			s.logger.Info("Reporting the GPU's devices unhealthy", "resource", r, "gpu", g.Index, "uuid", g.UUID, "reason", d.Reason)
		}
	}
}

// runExpiry expires pending allocations every interval until ctx ends.
func (s *state) runExpiry(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.expire()
		}
	}
}
