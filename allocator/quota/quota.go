// Package quota decides ElasticQuota-style admission and reclaim: each
// namespace is guaranteed its min, may borrow what others leave idle up to
// its max, and gets its min back by evicting borrowed work, whole gangs at a
// time. It is pure: the scheduler extender feeds it what the API server
// says (ElasticQuota objects, running pods) and acts on its answers.
package quota

import (
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/tessera-gpu/tessera/allocator/victims"
)

// Resources are amounts by resource name: whole GPUs, memory units and core
// units of the tessera resources, nvidia.com/gpu, ...
type Resources map[corev1.ResourceName]int64

// Add returns r + o.
func (r Resources) Add(o Resources) Resources {
	out := Resources{}
	for k, v := range r {
		out[k] = v
	}
	for k, v := range o {
		out[k] += v
	}
	return out
}

// Sub returns r - o.
func (r Resources) Sub(o Resources) Resources {
	neg := Resources{}
	for k, v := range o {
		neg[k] = -v
	}
	return r.Add(neg)
}

// exceeds returns the first resource (by name) where r is above limit,
// considering only resources limit names.
func (r Resources) exceeds(limit Resources) (corev1.ResourceName, bool) {
	for _, k := range sortedNames(limit) {
		if r[k] > limit[k] {
			return k, true
		}
	}
	return "", false
}

// String renders r sorted by name, e.g. "tessera.dev/gpu=8".
func (r Resources) String() string {
	var parts []string
	for _, k := range sortedNames(r) {
		parts = append(parts, fmt.Sprintf("%s=%d", k, r[k]))
	}
	return strings.Join(parts, ",")
}

func sortedNames(r Resources) []corev1.ResourceName {
	names := make([]corev1.ResourceName, 0, len(r))
	for k := range r {
		names = append(names, k)
	}
	sort.Slice(names, func(i, j int) bool { return names[i] < names[j] })
	return names
}

// Quota is one namespace's ElasticQuota.
type Quota struct {
	Namespace string
	// Min is guaranteed. A resource missing from Min is 0.
	Min Resources
	// Max caps use, borrowing included. A resource missing from Max is
	// not capped.
	Max Resources
	// Invalid says why the namespace's quota object is malformed (min
	// above max, a negative or fractional quantity): nothing new of the
	// namespace is admitted until it is fixed. A broken quota must not
	// make a namespace unlimited.
	Invalid string
}

// State is what admission and reclaim look at.
type State struct {
	// Quotas by namespace. Namespaces without one are not governed.
	Quotas map[string]Quota
	// Used is what each namespace's running and reserved pods use.
	Used map[string]Resources
	// Capacity is what the cluster has of each resource. Work may borrow
	// up to the larger of it and the sum of all mins.
	Capacity Resources
}

// Clone returns a deep copy.
func (s *State) Clone() *State {
	c := &State{Quotas: map[string]Quota{}, Used: map[string]Resources{}, Capacity: Resources{}.Add(s.Capacity)}
	for ns, q := range s.Quotas {
		c.Quotas[ns] = Quota{Namespace: q.Namespace, Min: Resources{}.Add(q.Min), Max: Resources{}.Add(q.Max), Invalid: q.Invalid}
	}
	for ns, u := range s.Used {
		c.Used[ns] = Resources{}.Add(u)
	}
	return c
}

// Decision is the answer to an admission question.
type Decision struct {
	Allowed bool
	// Borrowing is true when the request takes the namespace above its
	// min: the work may later be reclaimed.
	Borrowing bool
	// Reason explains a refusal, or what was borrowed.
	Reason string
}

// Admit decides whether namespace ns may start work using req.
func (s *State) Admit(ns string, req Resources) Decision {
	q, ok := s.Quotas[ns]
	if !ok {
		return Decision{Allowed: true, Reason: "namespace has no quota"}
	}
	if q.Invalid != "" {
		return Decision{Reason: fmt.Sprintf("%s's quota is invalid, so nothing new is admitted until it is fixed: %s", ns, q.Invalid)}
	}
	after := s.Used[ns].Add(req)
	if name, over := after.exceeds(q.Max); over {
		return Decision{Reason: fmt.Sprintf("%s would use %d %s, above its max %d", ns, after[name], name, q.Max[name])}
	}
	if _, over := after.exceeds(minOf(q, req)); !over {
		return Decision{Allowed: true, Reason: "within min"}
	}
	// Borrowing: the whole governed cluster must stay within what can be
	// lent, so that every borrowed unit can be reclaimed for a min.
	lendable := s.lendable()
	total := s.totalUsed().Add(req)
	for _, name := range sortedNames(req) {
		if req[name] == 0 {
			continue
		}
		if total[name] > lendable[name] {
			return Decision{Reason: fmt.Sprintf("%s would borrow %s but governed namespaces would use %d of %d lendable", ns, name, total[name], lendable[name])}
		}
	}
	if len(q.Min) == 0 {
		return Decision{Allowed: true, Borrowing: true, Reason: fmt.Sprintf("%s borrows: it has no min", ns)}
	}
	return Decision{Allowed: true, Borrowing: true, Reason: fmt.Sprintf("%s borrows above its min (%s)", ns, q.Min)}
}

// AdmitsWithout reports whether namespace ns is admitted req (Admit) once
// the workloads gone no longer count against their namespaces: what
// preempting them does for quota. It is the one rule by which preemption
// resolves a refusal (above max, or borrowing beyond what can be lent):
// the filter calls a refusal resolvable when the namespace's workloads of a
// lower priority than the pod, all gone, would admit it, and tier
// preemption (extender.Preemptor) takes victims until they admit it and
// the pod fits. Only the asker's own namespace's workloads can help: a
// namespace above its min may evict no other governed namespace's work
// (CanPreempt), and ungoverned work counts against no quota.
func (s *State) AdmitsWithout(ns string, req Resources, gone []Workload) bool {
	used := make(map[string]Resources, len(s.Used))
	for n, u := range s.Used {
		used[n] = u
	}
	for _, w := range gone {
		if _, governed := s.Quotas[w.Namespace]; governed {
			used[w.Namespace] = used[w.Namespace].Sub(w.Uses)
		}
	}
	without := State{Quotas: s.Quotas, Used: used, Capacity: s.Capacity}
	return without.Admit(ns, req).Allowed
}

// minOf is q.Min with 0 for every resource req names and Min does not.
func minOf(q Quota, req Resources) Resources {
	m := Resources{}.Add(q.Min)
	for k := range req {
		if _, ok := m[k]; !ok {
			m[k] = 0
		}
	}
	return m
}

func (s *State) totalUsed() Resources {
	total := Resources{}
	for ns := range s.Quotas {
		total = total.Add(s.Used[ns])
	}
	return total
}

// lendable is, per resource, the larger of the sum of mins and capacity.
func (s *State) lendable() Resources {
	out := Resources{}
	for _, q := range s.Quotas {
		out = out.Add(q.Min)
	}
	for k, v := range s.Capacity {
		if v > out[k] {
			out[k] = v
		}
	}
	return out
}

// Report is what a namespace uses, borrows and lends, for Events and
// metrics.
type Report struct {
	Namespace string
	Used      Resources
	// Borrowed is use above min; Lent is min left unused.
	Borrowed, Lent Resources
}

// Reports returns one Report per governed namespace, sorted by name.
func (s *State) Reports() []Report {
	var out []Report
	for ns, q := range s.Quotas {
		used := s.Used[ns].Add(nil)
		r := Report{Namespace: ns, Used: used, Borrowed: Resources{}, Lent: Resources{}}
		for _, k := range sortedNames(used.Add(q.Min)) {
			if d := used[k] - q.Min[k]; d > 0 {
				r.Borrowed[k] = d
			} else if d < 0 {
				r.Lent[k] = -d
			}
		}
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Namespace < out[j].Namespace })
	return out
}

// Workload is a unit of eviction: a whole gang, a pod outside any gang, or
// one extra member of an elastic gang (a member beyond its minimum).
type Workload struct {
	Namespace string
	Name      string
	Priority  int32
	Created   time.Time
	Uses      Resources
	// Pods are the pods to evict, by name.
	Pods []string
	// Extra marks an elastic gang's extra member: among workloads of one
	// priority, extras are taken before any whole workload.
	Extra bool
}

// ReclaimError says why reclaim cannot give a namespace its request.
type ReclaimError struct {
	Namespace string
	Reason    string
}

func (e *ReclaimError) Error() string {
	return fmt.Sprintf("reclaim for %s: %s", e.Namespace, e.Reason)
}

// Reclaim chooses whole workloads to evict so that namespace ns, which asks
// for req within its min, gets room. Candidates are other namespaces'
// workloads, lowest priority first, then elastic gangs' extra members
// before whole workloads, then newest first. A workload is taken
// only while its namespace stays at or above its own min after every
// eviction chosen so far, or, when no such choice frees the room, while it
// straddles its namespace's min (Straddles: the namespace borrows now, is
// then short of its min by less than the asker is, and the workload is an
// extra member or borrows more than that), so reclaim never flaps. enough reports whether the
// chosen victims free enough room (the caller checks real placement, on GPU
// level and with the asker's topology); it must be monotone. The choice is
// allocator/victims' (as for queues): the shortest enough prefix of the
// candidates, less every victim without which it is still enough, and when
// a namespace's min refused victims, the choice again without the victims
// whose freed room cannot serve the asker (another clique, node or rack
// than the one it needs). It returns the victims or a *ReclaimError.
func (s *State) Reclaim(ns string, req Resources, running []Workload, enough func(victims []Workload) bool) ([]Workload, error) {
	q, ok := s.Quotas[ns]
	if !ok {
		return nil, &ReclaimError{Namespace: ns, Reason: "the namespace has no quota, so nothing is guaranteed to it"}
	}
	after := s.Used[ns].Add(req)
	if name, over := after.exceeds(minOf(q, req)); over {
		return nil, &ReclaimError{Namespace: ns, Reason: fmt.Sprintf("it would use %d %s, above its min %d: only min is reclaimed", after[name], name, q.Min[name])}
	}
	cands := make([]Workload, 0, len(running))
	for _, w := range running {
		if w.Namespace != ns {
			if _, governed := s.Quotas[w.Namespace]; governed {
				cands = append(cands, w)
			}
		}
	}
	sort.SliceStable(cands, func(i, j int) bool {
		a, b := cands[i], cands[j]
		switch {
		case a.Priority != b.Priority:
			return a.Priority < b.Priority
		case a.Extra != b.Extra:
			return a.Extra
		case !a.Created.Equal(b.Created):
			return a.Created.After(b.Created)
		case a.Namespace != b.Namespace:
			return a.Namespace < b.Namespace
		}
		return a.Name < b.Name
	})
	// What the asker is short of its min, per resource asked: a victim's
	// namespace may fall below its own min by less (Straddles).
	short := Resources{}
	for k, v := range req {
		if v > 0 {
			short[k] = q.Min[k] - s.Used[ns][k]
		}
	}
	key := func(w Workload) string { return w.Namespace + "/" + w.Name }
	// Victims that keep every namespace at its min first; only when they
	// do not free the room may a workload straddle its namespace's min.
	for _, straddle := range []bool{false, true} {
		newTaker := func() func(Workload) bool {
			left := map[string]Resources{} // what each namespace keeps so far
			return func(w Workload) bool {
				used, seen := left[w.Namespace]
				if !seen {
					used = s.Used[w.Namespace].Add(nil)
				}
				rest := used.Sub(w.Uses)
				if !keepsMin(used, rest, s.Quotas[w.Namespace].Min, w, straddle, short) {
					return false
				}
				left[w.Namespace] = rest
				return true
			}
		}
		if chosen, ok := victims.Choose(cands, key, newTaker, enough); ok {
			return chosen, nil
		}
	}
	return nil, &ReclaimError{Namespace: ns, Reason: fmt.Sprintf("other namespaces borrow too little to free %s without falling under their own min", req)}
}

// keepsMin reports whether a namespace using before, rest without w, stays
// at or above its min in every resource w uses, or, with straddle, falls
// below it only where w straddles it for an asker short by short.
func keepsMin(before, rest, min Resources, w Workload, straddle bool, short Resources) bool {
	for k, v := range w.Uses {
		if v <= 0 || rest[k] >= min[k] {
			continue
		}
		if !straddle || !Straddles(before[k], rest[k], min[k], short, k, w.Extra) {
			return false
		}
	}
	return true
}

// Straddles reports whether a workload may be evicted from a namespace (or
// queue) guaranteed g of r, which uses before of r with it and rest
// without it, for an asker short of its own guarantee by short[r], though
// the victim's side then falls below its guarantee: it is above its
// guarantee now, what it is then short of is less than what the asker is
// short of (so the largest shortfall strictly falls with every such
// eviction and reclaim never flaps), and the workload is an elastic
// gang's extra member or borrows more of r than its side is then short
// (it is mostly borrowed). Without the last rule a tenant guaranteed 2
// GPUs kept 14 borrowed ones from a namespace short of its guarantee by
// running them as one 16-GPU gang; with it, what a workload keeps of its
// borrowing against an asker is at most what it holds within the
// guarantee. A nil short allows nothing.
func Straddles(before, rest, g int64, short Resources, r corev1.ResourceName, extra bool) bool {
	s, ok := short[r]
	if !ok || before <= g || g-rest >= s {
		return false
	}
	return extra || before-g > g-rest
}

// underMin reports whether rest is below min in any resource the workload
// uses.
func underMin(rest, min, uses Resources) bool {
	for k, v := range uses {
		if v > 0 && rest[k] < min[k] {
			return true
		}
	}
	return false
}

// CanPreempt reports whether a preemptor in namespace ns may evict the
// workload w, by the same rules as Reclaim: only to bring ns up to its min,
// and only when w's namespace stays at or above its own min. Within one
// namespace, priority alone decides (quota does not object).
func (s *State) CanPreempt(ns string, req Resources, w Workload) (bool, string) {
	if w.Namespace == ns {
		return true, "same namespace"
	}
	vq, governed := s.Quotas[w.Namespace]
	if !governed {
		return true, "victim's namespace has no quota"
	}
	q, ok := s.Quotas[ns]
	if !ok {
		return false, fmt.Sprintf("%s has no quota and may not evict %s's work", ns, w.Namespace)
	}
	if name, over := s.Used[ns].Add(req).exceeds(minOf(q, req)); over {
		return false, fmt.Sprintf("%s would be above its min in %s: it may not evict other namespaces' work", ns, name)
	}
	if underMin(s.Used[w.Namespace].Sub(w.Uses), vq.Min, w.Uses) {
		return false, fmt.Sprintf("evicting %s/%s would put %s under its own min", w.Namespace, w.Name, w.Namespace)
	}
	return true, "victim's namespace borrows"
}
