package extender

import (
	"context"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// passOver remembers the workloads (by key) whose eviction a
// PodDisruptionBudget refused, so that preemption and reclaim pass them
// over for a while and choose again without them.
type passOver struct {
	mu    sync.Mutex
	until map[string]time.Time
}

// add passes key over until until.
func (p *passOver) add(key string, until time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.until == nil {
		p.until = map[string]time.Time{}
	}
	p.until[key] = until
}

// current returns the keys passed over at now (and forgets the others).
func (p *passOver) current(now time.Time) map[string]bool {
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

// firstRefused dry-runs the eviction of every pod and returns the first
// one the API server refuses (a budget), with the refusal; nil when all
// may go (a pod already gone may go).
func firstRefused(ctx context.Context, evict func(context.Context, *corev1.Pod, bool) error, pods []*corev1.Pod) (*corev1.Pod, error) {
	for _, p := range pods {
		if err := evict(ctx, p, true); err != nil && !apierrors.IsNotFound(err) {
			return p, err
		}
	}
	return nil, nil
}
