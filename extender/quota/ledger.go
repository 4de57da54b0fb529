package quota

import (
	"fmt"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	core "github.com/tessera-gpu/tessera/allocator/quota"
	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/gpureq"
)

// Use is what a pod counts against its namespace's quota
// (gpureq.QuotaCount: what it holds at its peak of each resource quota
// governs, sidecars included; a pod with an invalid GPU request counts
// what it asks for, rounded up).
func Use(pod *corev1.Pod) core.Resources {
	return gpureq.QuotaCount(pod)
}

// Ledger builds quota states from the quotas in force, the pods the
// informer knows and the nodes' allocatable: everything is read afresh
// from the informers on each call, nothing is kept.
type Ledger struct {
	Quotas Source
	// Pods lists the pods of a namespace (informer cache).
	Pods func(namespace string) ([]*corev1.Pod, error)
	// Nodes lists the nodes (informer cache) for the cluster's capacity.
	Nodes func() ([]*corev1.Node, error)
	// Reserved reports a pod the GPU ledger holds (a bind in flight, or
	// the pod bound as the ledger's informer handler saw it, which may be
	// ahead of the index's): it counts as used. May be nil.
	Reserved func(types.UID) bool
	// Index, when set (and fed by the pod informer), serves FastState.
	Index *Index
	// Now is the clock of holds (nil: time.Now).
	Now func() time.Time

	mu    sync.Mutex
	holds map[string][]hold // reclaim asks, by namespace (see Hold)
}

// hold is room reclaimed for a namespace that its waiting work has not
// taken yet.
type hold struct {
	key string
	// base is what the namespace used (with the holds before this one)
	// when the room was reclaimed: the hold ends once its use reaches
	// base + uses, or its min.
	base, uses core.Resources
	expires    time.Time
}

// Hold counts uses for namespace ns, reclaimed for the waiting work key
// while ns used used, until the namespace's own use shows the work started
// or ttl passes. Reclaim holds the room it frees so that another
// namespace's borrowing work cannot take it first, which would make
// reclaim run again: the no-flap rule across the gap between an eviction
// and the asker's start. A second Hold of the same key replaces the first.
func (l *Ledger) Hold(ns, key string, used, uses core.Resources, ttl time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.holds == nil {
		l.holds = map[string][]hold{}
	}
	base := core.Resources{}.Add(used)
	var keep []hold
	for _, h := range l.holds[ns] {
		if h.key != key {
			keep = append(keep, h)
			base = base.Add(h.uses)
		}
	}
	l.holds[ns] = append(keep, hold{key: key, base: base, uses: uses, expires: l.clock().Add(ttl)})
}

func (l *Ledger) clock() time.Time {
	if l.Now != nil {
		return l.Now()
	}
	return time.Now()
}

// Counted reports whether pod counts against its namespace's quota: it
// is bound or planned (or reserved at bind), not finished and not being
// deleted (a pod being deleted frees its share; the GPU ledger still
// counts it until it is gone).
func (l *Ledger) Counted(pod *corev1.Pod) bool {
	if gpureq.Ended(pod) {
		return false
	}
	if pod.Spec.NodeName != "" {
		return true
	}
	if plan, ok, err := api.GetGangPlan(pod.Annotations); ok && err == nil && plan != nil {
		return true
	}
	return l.Reserved != nil && l.Reserved(pod.UID)
}

// View is a quota state with the pods behind it.
type View struct {
	State *core.State
	// Pods are the counted pods of governed namespaces.
	Pods []*corev1.Pod
	// Leaving are the pods of governed namespaces being deleted: not
	// counted by quota, still on their nodes until gone.
	Leaving []*corev1.Pod
}

// View builds the current state as namespace asking sees it (room held
// for other namespaces counts, its own hold does not). Pods for which skip
// is true are not counted (the pod being admitted, evictions in flight);
// skip may be nil.
func (l *Ledger) View(asking string, skip func(*corev1.Pod) bool) (*View, error) {
	quotas := l.Quotas.Quotas()
	st := &core.State{Quotas: quotas, Used: map[string]core.Resources{}, Capacity: core.Resources{}}
	v := &View{State: st}
	if len(quotas) == 0 {
		return v, nil
	}
	c, err := l.capacity()
	if err != nil {
		return nil, err
	}
	st.Capacity = c
	namespaces := make([]string, 0, len(quotas))
	for ns := range quotas {
		namespaces = append(namespaces, ns)
	}
	sort.Strings(namespaces)
	for _, ns := range namespaces {
		pods, err := l.Pods(ns)
		if err != nil {
			return nil, fmt.Errorf("listing pods of %s: %w", ns, err)
		}
		used := core.Resources{}
		seen := make(map[types.UID]bool, len(pods))
		for _, p := range pods {
			seen[p.UID] = true
			if p.DeletionTimestamp != nil {
				v.Leaving = append(v.Leaving, p)
			}
			if !l.Counted(p) || (skip != nil && skip(p)) {
				continue
			}
			used = used.Add(Use(p))
			v.Pods = append(v.Pods, p)
		}
		// Binds in flight of pods the listers do not show yet.
		used = used.Add(l.Index.Booked(ns, seen, l.Reserved))
		st.Used[ns] = used
	}
	l.applyHolds(st, asking)
	return v, nil
}

// applyHolds adds the holds of namespaces other than asking to st.Used,
// dropping the holds that ended.
func (l *Ledger) applyHolds(st *core.State, asking string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.clock()
	for ns, hs := range l.holds {
		var keep []hold
		for _, h := range hs {
			if now.After(h.expires) || coversHold(st.Used[ns], st.Quotas[ns].Min, h.base.Add(h.uses)) {
				continue
			}
			keep = append(keep, h)
			if ns != asking {
				st.Used[ns] = st.Used[ns].Add(h.uses)
			}
		}
		if len(keep) == 0 {
			delete(l.holds, ns)
		} else {
			l.holds[ns] = keep
		}
	}
}

// capacity sums the nodes' allocatable of the governed resources.
func (l *Ledger) capacity() (core.Resources, error) {
	nodes, err := l.Nodes()
	if err != nil {
		return nil, fmt.Errorf("listing nodes: %w", err)
	}
	return Capacity(nodes, func(n *corev1.Node) corev1.ResourceList { return n.Status.Allocatable }), nil
}

// Capacity sums what of (allocatable or capacity) says the nodes
// have of the governed resources.
func Capacity(nodes []*corev1.Node, of func(*corev1.Node) corev1.ResourceList) core.Resources {
	c := core.Resources{}
	for _, n := range nodes {
		for name, q := range of(n) {
			if api.QuotaGoverned(name) {
				c[name] += q.Value()
			}
		}
	}
	return c
}

// FastState is View's state without the pods, from the Index (nil when
// the ledger has none): what admission needs on every filter call. The
// pod skip (the one being admitted) is not counted.
func (l *Ledger) FastState(asking string, skip types.UID) (*core.State, error) {
	if l.Index == nil {
		return nil, nil
	}
	quotas := l.Quotas.Quotas()
	st := &core.State{Quotas: quotas, Used: map[string]core.Resources{}, Capacity: core.Resources{}}
	if len(quotas) == 0 {
		return st, nil
	}
	c, err := l.capacity()
	if err != nil {
		return nil, err
	}
	st.Capacity = c
	st.Used = l.Index.usedBy(quotas, l.Reserved, skip)
	l.applyHolds(st, asking)
	return st, nil
}

// coversHold reports whether a namespace's own use has reached target
// (what it used plus what was held for it) or its min, so that the hold is
// no longer needed.
func coversHold(used, min, target core.Resources) bool {
	for k, v := range target {
		if v > 0 && used[k] < min[k] && used[k] < v {
			return false
		}
	}
	return true
}
