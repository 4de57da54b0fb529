package planner

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// What the tests of package planner_test reach inside the planner.

// Moves is the consolidation counter.
func (c *Consolidator) Moves() *prometheus.CounterVec { return c.moves }

// Moved records the eviction of pod uid.
func (c *Consolidator) Moved(uid types.UID) { c.moved(uid) }

// Hints are the pods evicted lately and those passed over.
func (c *Consolidator) Hints() (evicted, blocked map[types.UID]bool) { return c.hints() }

// Settle counts the evictions whose result is known at now.
func (r *QueueReclaimer) Settle(now time.Time) int { return r.settle(now) }

// SetClient replaces the planner's client.
func (p *GangPlanner) SetClient(c GangClient) { p.client = c }

// Wait is the planner's wait: a GangWaiting or QueueWaiting Event on each
// of pods not told reason yet; WaitQueue for a queue's refusal.
func (p *GangPlanner) Wait(key string, pods []*corev1.Pod, reason string) { p.wait(key, pods, reason) }

// WaitQueue is the planner's waitQueue.
func (p *GangPlanner) WaitQueue(key string, pods []*corev1.Pod, reason string) {
	p.waitQueue(key, pods, reason)
}
