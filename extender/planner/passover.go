package planner

import (
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/api"
)

// PassOver remembers the workloads (by key) whose eviction a
// PodDisruptionBudget refused, so that preemption (extender.Preemptor) and
// reclaim pass them over for a while and choose again without them. The
// zero value is ready to use.
type PassOver struct {
	mu    sync.Mutex
	until map[string]time.Time
}

// Add passes key over until until.
func (p *PassOver) Add(key string, until time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.until == nil {
		p.until = map[string]time.Time{}
	}
	p.until[key] = until
}

// Current returns the keys passed over at now (and forgets the others).
func (p *PassOver) Current(now time.Time) map[string]bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]bool, len(p.until))
	for k, until := range p.until {
		if now.After(until) {
			delete(p.until, k)
			continue
		}
		out[k] = true
	}
	return out
}

// UnitOf is the eviction unit key of a pod: its gang's ("gang
// <namespace>/<name>"), or its own ("pod <namespace>/<name>").
func UnitOf(pod *corev1.Pod) string {
	if pod == nil {
		return ""
	}
	if g, ok, err := api.GangOf(pod); ok && err == nil {
		return api.GangUnitKey(g.Key())
	}
	return api.PodKey(pod.Namespace, pod.Name)
}

// EvictionMemory is how long an eviction made counts its pod as gone:
// the informer shows an evicted pod leaving well before.
const EvictionMemory = 2 * time.Minute

// Evictions remembers the pods evicted in the last EvictionMemory, so that
// the next choice counts them as gone while the informer may not show
// them leaving yet: an eviction in flight is neither repeated nor replaced
// by another. Safe for concurrent use; the zero value is empty.
type Evictions struct {
	mu sync.Mutex
	at map[types.UID]time.Time
}

// Add records the eviction of pod uid at now.
func (e *Evictions) Add(uid types.UID, now time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.at == nil {
		e.at = map[types.UID]time.Time{}
	}
	e.at[uid] = now
}

// Current returns the pods evicted less than EvictionMemory before now
// (and forgets the others).
func (e *Evictions) Current(now time.Time) map[types.UID]bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make(map[types.UID]bool, len(e.at))
	for uid, at := range e.at {
		if now.Sub(at) >= EvictionMemory {
			delete(e.at, uid)
			continue
		}
		out[uid] = true
	}
	return out
}
