package planner

import (
	"context"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

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

// FirstRefused dry-runs the eviction of every pod and returns the first
// one the API server refuses (a budget), with the refusal; nil when all
// may go (a pod already gone may go).
func FirstRefused(ctx context.Context, evict func(context.Context, *corev1.Pod, bool) error, pods []*corev1.Pod) (*corev1.Pod, error) {
	for _, p := range pods {
		if err := evict(ctx, p, true); err != nil && !apierrors.IsNotFound(err) {
			return p, err
		}
	}
	return nil, nil
}

// UnitOf is the eviction unit key of a pod: its gang's ("gang
// <namespace>/<name>"), or its own ("pod <namespace>/<name>").
func UnitOf(pod *corev1.Pod) string {
	if pod == nil {
		return ""
	}
	if g, ok, err := api.GangOf(pod); ok && err == nil {
		return "gang " + g.Key()
	}
	return "pod " + pod.Namespace + "/" + pod.Name
}

// StartedAt is when a pod started: its status's start time, else its
// creation.
func StartedAt(pod *corev1.Pod) time.Time {
	if pod.Status.StartTime != nil {
		return pod.Status.StartTime.Time
	}
	return pod.CreationTimestamp.Time
}
