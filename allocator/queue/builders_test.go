package queue

import (
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/tessera-gpu/tessera/allocator/quota"
)

// The resource names the tests use (the api package's, spelled out so the
// pure core's tests need nothing else).
const (
	gpu corev1.ResourceName = "tessera.dev/gpu"
	mem corev1.ResourceName = "tessera.dev/gpu-memory"
)

var t0 = time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)

func gpus(n int64) quota.Resources { return quota.Resources{gpu: n} }

// q is a queue guaranteeing g GPUs, unlimited.
func q(name, parent string, g int64, namespaces ...string) Spec {
	return Spec{Name: name, Parent: parent, Namespaces: namespaces, Guaranteed: gpus(g)}
}

func (s Spec) limit(n int64) Spec { s.Limit = gpus(n); return s }
func (s Spec) weigh(w int64) Spec { s.Weight = map[corev1.ResourceName]int64{gpu: w}; return s }

// departments is two departments of two teams each, every team
// guaranteed 4 GPUs, every department 8, on 16 GPUs.
func departments() *Tree {
	return Build([]Spec{
		q("dept-a", "", 8), q("dept-b", "", 8),
		q("a1", "dept-a", 4, "ns-a1"), q("a2", "dept-a", 4, "ns-a2"),
		q("b1", "dept-b", 4, "ns-b1"), q("b2", "dept-b", 4, "ns-b2"),
	})
}

// state builds a State of 16 GPUs with used and pending GPUs per leaf.
func state(t *Tree, used, pending map[string]int64) *State {
	s := &State{Tree: t, Capacity: gpus(16), Used: map[string]quota.Resources{}, Pending: map[string]quota.Resources{}}
	for k, v := range used {
		s.Used[k] = gpus(v)
	}
	for k, v := range pending {
		s.Pending[k] = gpus(v)
	}
	return s
}

// wl is a preemptible workload of n GPUs created age before t0.
func wl(queue, name string, prio int32, age time.Duration, n int64) Workload {
	return Workload{Key: queue + "/" + name, Queue: queue, Priority: prio, Created: t0.Add(-age), Uses: gpus(n), Preemptible: true}
}

// extra marks w as an elastic gang's extra member.
func extra(w Workload) Workload { w.Extra = true; return w }

func keys(ws []Workload) []string {
	var out []string
	for _, w := range ws {
		out = append(out, w.Key)
	}
	return out
}

// freed is an enough func: the victims free at least n GPUs.
func freed(n int64) func([]Workload) bool {
	return func(v []Workload) bool {
		var sum int64
		for _, w := range v {
			sum += w.Uses[gpu]
		}
		return sum >= n
	}
}
