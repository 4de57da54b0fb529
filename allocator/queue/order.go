package queue

import (
	"math"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/tessera-gpu/tessera/allocator/quota"
)

// Share is a queue's dominant share of its entitlement: the larger it is,
// the later the queue's workloads go. It is the maximum over resources r
// of
//
//	(Usage[q][r] / (h/ln 2) + used[q][r]) / entitlement[q][r]
//
// where h is the State's HalfLife. Usage[q][r] / (h/ln 2) is the queue's
// average use lately: Accrue sums one unit used forever up to h/ln 2, so a
// queue that used u units steadily for a long while has u there, and one
// that used u for one half-life u/2. The current use is added, so that
// the share of every queue, with history or without, grows as its work is
// admitted, and a pass that admits workload after workload goes back and
// forth between queues by their shares. At equal entitlements the queue
// with more recent history goes second. Without decay (HalfLife ≤ 0) the
// history is a plain sum in resource-seconds.
//
// The entitlement of r is the queue's guarantee when above 0, else its fair
// share (FairShare) when above 0, else Capacity; resources with none of
// these are left out. A parent's history is its own Usage entry, or the sum
// of its children's.
func (s *State) Share(queue string) float64 {
	return s.view().share[queue]
}

// lately is, per resource, queue q's recent use (its usage history over
// the half-life's steady state, what it used on average lately) plus used.
func (v *view) lately(q string, used quota.Resources) map[corev1.ResourceName]float64 {
	norm := steadyState(v.s.HalfLife)
	out := map[corev1.ResourceName]float64{}
	for r, h := range v.hist[q] {
		if h > 0 {
			out[r] = h / norm
		}
	}
	for r, u := range used {
		out[r] += float64(u)
	}
	return out
}

// shareOf returns Share and the current share (used over entitlement) of
// a queue.
func (v *view) shareOf(name string) (share, current float64) {
	sp := v.spec(name)
	ent := func(rn corev1.ResourceName) float64 {
		switch {
		case sp.Guaranteed[rn] > 0:
			return float64(sp.Guaranteed[rn])
		case v.fair[name][rn] > 0:
			return float64(v.fair[name][rn])
		case v.s.Capacity[rn] > 0:
			return float64(v.s.Capacity[rn])
		}
		return 0
	}
	for r, u := range v.used[name] {
		if e := ent(r); e > 0 && u > 0 {
			current = math.Max(current, float64(u)/e)
		}
	}
	for r, u := range v.lately(name, v.used[name]) {
		if e := ent(r); e > 0 && u > 0 {
			share = math.Max(share, u/e)
		}
	}
	return share, current
}

// Less reports whether queue qa's workloads go before qb's, at equal
// priority. Like Kueue's and KAI's hierarchical fair sharing, it compares
// the two children of the deepest common ancestor on the paths to qa and
// qb (top-level queues when there is none): the one with the smaller Share
// goes first, then the one with the smaller current share, then by name.
// A queue is never before itself or its ancestors; unknown queues go after
// known ones, by name.
func (s *State) Less(qa, qb string) bool {
	return s.view().less(qa, qb)
}

func (v *view) less(qa, qb string) bool {
	na, oka := v.t.node(qa)
	nb, okb := v.t.node(qb)
	switch {
	case !oka && !okb:
		return qa < qb
	case !oka || !okb:
		return oka
	}
	pa, pb := na.path, nb.path
	i := 0
	for i < len(pa) && i < len(pb) && pa[i] == pb[i] {
		i++
	}
	if i == len(pa) || i == len(pb) {
		return false // one is the other or its ancestor
	}
	a, b := pa[i], pb[i]
	if v.share[a] != v.share[b] {
		return v.share[a] < v.share[b]
	}
	if v.current[a] != v.current[b] {
		return v.current[a] < v.current[b]
	}
	return a < b
}

// Workload is a unit of admission and eviction: a gang, or a GPU pod
// outside any gang.
type Workload struct {
	// Key names the workload (namespace/name); it breaks ties.
	Key   string
	Queue string
	// Priority is the workload's tier (its PriorityClass value).
	Priority int32
	Created  time.Time
	Uses     quota.Resources
	// Preemptible is false for work that may not be evicted now
	// (PodDisruptionBudget, minimum runtime, ...): Reclaim never picks it
	// and CanPreempt refuses it.
	Preemptible bool
	// Extra marks a member of an elastic gang beyond its minimum, offered
	// alone beside its whole gang: among equal priorities Reclaim takes
	// extras before any whole workload.
	Extra bool
}

// Order sorts workloads into the order they go: higher priority first,
// then their queues' order (Less), then older first, then by Key.
func (s *State) Order(ws []Workload) {
	v := s.view()
	rank := v.queueRanks(ws)
	sort.SliceStable(ws, func(i, j int) bool {
		a, b := &ws[i], &ws[j]
		switch {
		case a.Priority != b.Priority:
			return a.Priority > b.Priority
		case rank[a.Queue] != rank[b.Queue]:
			return rank[a.Queue] < rank[b.Queue]
		case !a.Created.Equal(b.Created):
			return a.Created.Before(b.Created)
		}
		return a.Key < b.Key
	})
}

// queueRanks numbers the workloads' queues in Less order: Less is a total
// order on leaves (lexicographic over the siblings along the paths), so
// one sort of the distinct queues replaces a comparison per pair of
// workloads.
func (v *view) queueRanks(ws []Workload) map[string]int {
	seen := map[string]bool{}
	var qs []string
	for _, w := range ws {
		if !seen[w.Queue] {
			seen[w.Queue] = true
			qs = append(qs, w.Queue)
		}
	}
	sort.Slice(qs, func(i, j int) bool {
		if v.less(qs[i], qs[j]) {
			return true
		}
		if v.less(qs[j], qs[i]) {
			return false
		}
		return qs[i] < qs[j] // a queue and its ancestor: by name, for a total order
	})
	rank := make(map[string]int, len(qs))
	for i, q := range qs {
		rank[q] = i
	}
	return rank
}
