package queue

import (
	"math"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/tessera-gpu/tessera/allocator/quota"
)

// State is what fair share, order, admission and reclaim look at: a
// snapshot, read and never changed by this package.
type State struct {
	Tree *Tree
	// Capacity is what the cluster has of each resource for the queues.
	Capacity quota.Resources
	// Used is what each leaf queue's running and reserved work uses. A
	// parent's used is the sum of its subtree (an entry for a parent is
	// added to that sum).
	Used map[string]quota.Resources
	// Pending is each leaf queue's waiting demand, summed the same way.
	Pending map[string]quota.Resources
	// Waiting, when set, lists what each leaf queue's waiting workloads
	// use, one entry per workload. Lending then protects, of a queue's
	// unmet guarantee, only the waiting work that could start within it:
	// a workload larger than what the queue's guarantee leaves would
	// have to borrow anyway, and protecting room for it would keep every
	// such workload of every queue waiting for ever. Without Waiting, all
	// of Pending is protected (up to the guarantee).
	Waiting map[string][]quota.Resources
	// Usage is the decayed history per queue, leaf or parent (Accrue). A
	// queue without an entry has the sum of its children's.
	Usage map[string]Usage
	// HalfLife is the half-life Usage decays with; it normalises Share.
	// 0 or less means Usage is a plain sum.
	HalfLife time.Duration
	// HistoryWeight is how much recent use (Usage, with HalfLife above 0)
	// lowers a queue's part of what is lent beyond guarantees (FairShare,
	// "time-based fair share"): 0 splits it by weight alone.
	HistoryWeight float64
}

// DefaultHistoryWeight is the HistoryWeight the extender and the
// simulator use unless told otherwise.
const DefaultHistoryWeight = 1.0

// view is what the questions derive from a State once: subtree sums, fair
// shares, history and shares of every queue.
type view struct {
	s    *State
	t    *Tree
	used map[string]quota.Resources // subtree sums, every queue
	pend map[string]quota.Resources
	// demand is used plus pending, pending counting only under valid
	// queues (an invalid one admits nothing more).
	demand map[string]quota.Resources
	// startable is, when State.Waiting is set, the waiting work of each
	// queue's subtree that could start within its leaf's guarantee.
	startable map[string]quota.Resources
	fair      map[string]quota.Resources
	hist      map[string]Usage
	// share and current are Share with and without history.
	share, current map[string]float64
}

// withinLimit is demand d capped, resource by resource, by limit (a
// resource the limit does not name is not capped): what a child can take
// of its parent's share, as splitLevel counts it (a parent's fair share
// counted its children's demand beyond their limits, and showed 6 GPUs
// for a department whose teams could use 4).
func withinLimit(d, limit quota.Resources) quota.Resources {
	out := quota.Resources{}
	for r, v := range d {
		if lim, ok := limit[r]; ok {
			v = min(v, max(lim, 0))
		}
		out[r] = v
	}
	return out
}

func (s *State) view() *view {
	v := &view{s: s, t: s.Tree, used: map[string]quota.Resources{}, pend: map[string]quota.Resources{}, hist: map[string]Usage{}}
	if v.t == nil {
		v.t = Build(nil)
	}
	order := v.t.order
	for i := len(order) - 1; i >= 0; i-- {
		name := order[i]
		u := quota.Resources{}.Add(s.Used[name])
		p := quota.Resources{}.Add(s.Pending[name])
		var h Usage
		if own, ok := s.Usage[name]; ok {
			h = own.clone()
		}
		for _, c := range v.t.nodes[name].children {
			u = u.Add(v.used[c])
			p = p.Add(v.pend[c])
			if _, ok := s.Usage[name]; !ok {
				h = h.add(v.hist[c])
			}
		}
		v.used[name], v.pend[name], v.hist[name] = u, p, h
	}
	v.demand = map[string]quota.Resources{}
	for i := len(order) - 1; i >= 0; i-- {
		name := order[i]
		d := quota.Resources{}.Add(s.Used[name])
		if v.t.Invalid(name) == "" {
			d = d.Add(s.Pending[name])
		}
		for _, c := range v.t.nodes[name].children {
			d = d.Add(withinLimit(v.demand[c], v.spec(c).Limit))
		}
		v.demand[name] = d
	}
	if s.Waiting != nil {
		v.startable = map[string]quota.Resources{}
		for i := len(order) - 1; i >= 0; i-- {
			name := order[i]
			st := quota.Resources{}
			if v.t.Invalid(name) == "" {
				st = startableWithin(v.spec(name).Guaranteed, s.Used[name], s.Waiting[name])
			}
			for _, c := range v.t.nodes[name].children {
				st = st.Add(v.startable[c])
			}
			v.startable[name] = st
		}
	}
	v.fair = v.fairShare()
	v.share, v.current = map[string]float64{}, map[string]float64{}
	for _, name := range order {
		v.share[name], v.current[name] = v.shareOf(name)
	}
	return v
}

// totalUsed is what every queue uses together.
func (v *view) totalUsed() quota.Resources {
	total := quota.Resources{}
	for _, r := range v.t.roots {
		total = total.Add(v.used[r])
	}
	return total
}

func (v *view) spec(name string) Spec { return v.t.nodes[name].spec }

// onPath reports whether q is on path.
func onPath(path []string, q string) bool {
	for _, p := range path {
		if p == q {
			return true
		}
	}
	return false
}

func sortedNames[V any](r map[corev1.ResourceName]V) []corev1.ResourceName {
	names := make([]corev1.ResourceName, 0, len(r))
	for k := range r {
		names = append(names, k)
	}
	sort.Slice(names, func(i, j int) bool { return names[i] < names[j] })
	return names
}

// positive returns the resources r names with an amount above 0, sorted.
func positive(r quota.Resources) []corev1.ResourceName {
	var out []corev1.ResourceName
	for _, k := range sortedNames(r) {
		if r[k] > 0 {
			out = append(out, k)
		}
	}
	return out
}

// satAdd adds non-negative amounts, saturating at math.MaxInt64.
func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// startableWithin sums the waiting workloads that fit, one after another,
// smallest first, in what guaranteed leaves beyond used.
func startableWithin(guaranteed, used quota.Resources, waiting []quota.Resources) quota.Resources {
	room := quota.Resources{}
	for r, g := range guaranteed {
		room[r] = max(g-used[r], 0)
	}
	ws := append([]quota.Resources(nil), waiting...)
	size := func(w quota.Resources) int64 {
		var n int64
		for _, v := range w {
			n = satAdd(n, v)
		}
		return n
	}
	sort.SliceStable(ws, func(i, j int) bool { return size(ws[i]) < size(ws[j]) })
	out := quota.Resources{}
next:
	for _, w := range ws {
		for r, v := range w {
			if v > room[r] {
				continue next
			}
		}
		for r, v := range w {
			room[r] -= v
			out[r] += v
		}
	}
	return out
}
