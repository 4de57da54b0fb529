package extender

import (
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/allocator/quota"
	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/gpureq"
)

// Filter reasons of quota admission (metric label reason).
const (
	// QuotaAboveMax: the pod would take its namespace above its max.
	QuotaAboveMax Reason = "quota-above-max"
	// QuotaNotLendable: the pod would borrow beyond what governed
	// namespaces can lend.
	QuotaNotLendable Reason = "quota-borrow-limit"
)

// QuotaSource gives the ElasticQuotas in force, by namespace.
type QuotaSource interface {
	// Quotas returns the quotas by namespace: empty when there are none
	// or the ElasticQuota CRD is not installed.
	Quotas() map[string]quota.Quota
}

// QuotaWatcher watches ElasticQuota objects (scheduling.x-k8s.io/v1alpha1)
// (a CRDWatcher of api.ElasticQuotaGVR) and decodes them.
type QuotaWatcher struct {
	CRDWatcher

	mu        sync.Mutex
	malformed map[string]string // key -> last error logged
}

var _ QuotaSource = (*QuotaWatcher)(nil)

// NewQuotaWatcher returns a watcher of ElasticQuotas.
func NewQuotaWatcher(dyn dynamic.Interface, disc GroupVersionResourcer, retry time.Duration, onChange func()) *QuotaWatcher {
	return &QuotaWatcher{CRDWatcher: CRDWatcher{Dynamic: dyn, Discovery: disc, Retry: retry, Resource: api.ElasticQuotaGVR, Kind: "ElasticQuota", OnChange: onChange}}
}

// Quotas decodes the ElasticQuotas of the informer's store. A malformed
// object is logged (once per error) and admits nothing in its namespace
// (QuotasOf); of several in one namespace, the first by name applies.
func (w *QuotaWatcher) Quotas() map[string]quota.Quota {
	out, errs := QuotasOf(w.Objects())
	if len(errs) > 0 {
		w.mu.Lock()
		if w.malformed == nil {
			w.malformed = map[string]string{}
		}
		for key, err := range errs {
			if w.malformed[key] != err.Error() {
				w.malformed[key] = err.Error()
				klog.Background().Info("Ignoring an ElasticQuota", "quota", key, "err", err)
			}
		}
		w.mu.Unlock()
	}
	return out
}

// QuotasOf decodes ElasticQuota objects into quotas by namespace, over the
// resources quota governs (api.QuotaResources). Malformed objects are
// returned as errors by namespace/name and, when first by name in their
// namespace, govern it as an Invalid quota that admits nothing; of several
// in one namespace the first by name applies, the others are errors.
func QuotasOf(objs []*unstructured.Unstructured) (map[string]quota.Quota, map[string]error) {
	sort.Slice(objs, func(i, j int) bool {
		if objs[i].GetNamespace() != objs[j].GetNamespace() {
			return objs[i].GetNamespace() < objs[j].GetNamespace()
		}
		return objs[i].GetName() < objs[j].GetName()
	})
	out := map[string]quota.Quota{}
	errs := map[string]error{}
	applied := map[string]string{} // namespace -> name of the quota in force
	for _, u := range objs {
		key := u.GetNamespace() + "/" + u.GetName()
		eq, err := api.ElasticQuotaFromUnstructured(u)
		if err != nil {
			errs[key] = err
			// Fail closed: the namespace is governed by a quota that
			// admits nothing until the object is fixed (unless one
			// before it by name applies).
			if _, dup := applied[u.GetNamespace()]; !dup {
				applied[u.GetNamespace()] = u.GetName()
				out[u.GetNamespace()] = quota.Quota{Namespace: u.GetNamespace(), Min: quota.Resources{}, Max: quota.Resources{}, Invalid: err.Error()}
			}
			continue
		}
		if first, dup := applied[eq.Namespace]; dup {
			errs[key] = fmt.Errorf("ElasticQuota %s: namespace %s already has one, %s, which applies", key, eq.Namespace, first)
			continue
		}
		applied[eq.Namespace] = eq.Name
		q := quota.Quota{Namespace: eq.Namespace, Min: quota.Resources{}, Max: quota.Resources{}}
		for _, name := range api.QuotaResources() {
			if v, ok := eq.Min[name]; ok {
				q.Min[name] = v.Value()
			}
			if v, ok := eq.Max[name]; ok {
				q.Max[name] = v.Value()
			}
		}
		out[eq.Namespace] = q
	}
	return out, errs
}

// PodQuotaUse is what a pod counts against its namespace's quota
// (gpureq.QuotaCount: what it holds at its peak of each resource quota
// governs, sidecars included; a pod with an invalid GPU request counts
// what it asks for, rounded up).
func PodQuotaUse(pod *corev1.Pod) quota.Resources {
	return gpureq.QuotaCount(pod)
}

// QuotaLedger builds quota states from the quotas in force, the pods the
// informer knows and the nodes' allocatable: everything is read afresh
// from the informers on each call, nothing is kept.
type QuotaLedger struct {
	Quotas QuotaSource
	// Pods lists the pods of a namespace (informer cache).
	Pods func(namespace string) ([]*corev1.Pod, error)
	// Nodes lists the nodes (informer cache) for the cluster's capacity.
	Nodes func() ([]*corev1.Node, error)
	// Reserved reports a pod the ledger holds a reservation for (a bind
	// in flight): it counts as used. May be nil.
	Reserved func(types.UID) bool
	// Index, when set (and fed by the pod informer), serves FastState.
	Index *QuotaIndex

	mu    sync.Mutex
	holds map[string][]hold // reclaim asks, by namespace (see Hold)
	now   func() time.Time
}

// hold is room reclaimed for a namespace that its waiting work has not
// taken yet.
type hold struct {
	key string
	// base is what the namespace used (with the holds before this one)
	// when the room was reclaimed: the hold ends once its use reaches
	// base + uses, or its min.
	base, uses quota.Resources
	expires    time.Time
}

// Hold counts uses for namespace ns, reclaimed for the waiting work key
// while ns used used, until the namespace's own use shows the work started
// or ttl passes. Reclaim holds the room it frees so that another
// namespace's borrowing work cannot take it first, which would make
// reclaim run again: the no-flap rule across the gap between an eviction
// and the asker's start. A second Hold of the same key replaces the first.
func (l *QuotaLedger) Hold(ns, key string, used, uses quota.Resources, ttl time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.holds == nil {
		l.holds = map[string][]hold{}
	}
	base := quota.Resources{}.Add(used)
	var keep []hold
	for _, h := range l.holds[ns] {
		if h.key != key {
			keep = append(keep, h)
			base = base.Add(h.uses)
		}
	}
	l.holds[ns] = append(keep, hold{key: key, base: base, uses: uses, expires: l.clock().Add(ttl)})
}

func (l *QuotaLedger) clock() time.Time {
	if l.now != nil {
		return l.now()
	}
	return time.Now()
}

// Counted reports whether pod counts against its namespace's quota: it
// is bound or planned (or reserved at bind), not finished and not being
// deleted (a pod being deleted frees its share; the GPU ledger still
// counts it until it is gone).
func (l *QuotaLedger) Counted(pod *corev1.Pod) bool {
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

// QuotaView is a quota state with the pods behind it.
type QuotaView struct {
	State *quota.State
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
func (l *QuotaLedger) View(asking string, skip func(*corev1.Pod) bool) (*QuotaView, error) {
	quotas := l.Quotas.Quotas()
	st := &quota.State{Quotas: quotas, Used: map[string]quota.Resources{}, Capacity: quota.Resources{}}
	v := &QuotaView{State: st}
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
		used := quota.Resources{}
		for _, p := range pods {
			if p.DeletionTimestamp != nil {
				v.Leaving = append(v.Leaving, p)
			}
			if !l.Counted(p) || (skip != nil && skip(p)) {
				continue
			}
			used = used.Add(PodQuotaUse(p))
			v.Pods = append(v.Pods, p)
		}
		st.Used[ns] = used
	}
	l.applyHolds(st, asking)
	return v, nil
}

// applyHolds adds the holds of namespaces other than asking to st.Used,
// dropping the holds that ended.
func (l *QuotaLedger) applyHolds(st *quota.State, asking string) {
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
func (l *QuotaLedger) capacity() (quota.Resources, error) {
	nodes, err := l.Nodes()
	if err != nil {
		return nil, fmt.Errorf("listing nodes: %w", err)
	}
	return clusterCapacity(nodes, func(n *corev1.Node) corev1.ResourceList { return n.Status.Allocatable }), nil
}

// clusterCapacity sums what of (allocatable or capacity) says the nodes
// have of the governed resources.
func clusterCapacity(nodes []*corev1.Node, of func(*corev1.Node) corev1.ResourceList) quota.Resources {
	c := quota.Resources{}
	for _, n := range nodes {
		for _, name := range api.QuotaResources() {
			if q, ok := of(n)[name]; ok {
				c[name] += q.Value()
			}
		}
	}
	return c
}

// FastState is View's state without the pods, from the Index (nil when
// the ledger has none): what admission needs on every filter call. The
// pod skip (the one being admitted) is not counted.
func (l *QuotaLedger) FastState(asking string, skip types.UID) (*quota.State, error) {
	if l.Index == nil {
		return nil, nil
	}
	quotas := l.Quotas.Quotas()
	st := &quota.State{Quotas: quotas, Used: map[string]quota.Resources{}, Capacity: quota.Resources{}}
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

// QuotaIndex keeps, from pod informer events, every pod's quota use and
// whether it counts (see QuotaLedger.Counted), with the sums by namespace,
// so that admission at filter does not walk every pod.
type QuotaIndex struct {
	mu   sync.RWMutex
	pods map[types.UID]indexedPod
	// used sums the counted pods by namespace.
	used map[string]quota.Resources
}

type indexedPod struct {
	ns   string
	uses quota.Resources
	// counted: bound or planned, live. Otherwise the pod is live and
	// unbound: it counts only while the GPU ledger holds a reservation
	// for it (a bind in flight).
	counted bool
}

// Set indexes a pod (added or updated).
func (x *QuotaIndex) Set(pod *corev1.Pod) {
	uses := PodQuotaUse(pod)
	live := !gpureq.Ended(pod)
	counted := live && pod.Spec.NodeName != ""
	if live && !counted {
		plan, ok, err := api.GetGangPlan(pod.Annotations)
		counted = ok && err == nil && plan != nil
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	x.removeLocked(pod.UID)
	if !live || len(uses) == 0 {
		return
	}
	if x.pods == nil {
		x.pods, x.used = map[types.UID]indexedPod{}, map[string]quota.Resources{}
	}
	x.pods[pod.UID] = indexedPod{ns: pod.Namespace, uses: uses, counted: counted}
	if counted {
		x.used[pod.Namespace] = addInPlace(x.used[pod.Namespace], uses, 1)
	}
}

// Delete forgets a pod.
func (x *QuotaIndex) Delete(uid types.UID) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.removeLocked(uid)
}

func (x *QuotaIndex) removeLocked(uid types.UID) {
	old, ok := x.pods[uid]
	if !ok {
		return
	}
	delete(x.pods, uid)
	if old.counted {
		x.used[old.ns] = addInPlace(x.used[old.ns], old.uses, -1)
	}
}

func addInPlace(dst, r quota.Resources, sign int64) quota.Resources {
	if dst == nil {
		dst = quota.Resources{}
	}
	for k, v := range r {
		dst[k] += sign * v
		if dst[k] == 0 {
			delete(dst, k)
		}
	}
	return dst
}

// usedBy returns the use of each namespace of quotas: its counted pods, its
// reserved unbound pods, less the pod skip.
func (x *QuotaIndex) usedBy(quotas map[string]quota.Quota, reserved func(types.UID) bool, skip types.UID) map[string]quota.Resources {
	out := make(map[string]quota.Resources, len(quotas))
	x.mu.RLock()
	defer x.mu.RUnlock()
	for ns := range quotas {
		out[ns] = quota.Resources{}.Add(x.used[ns])
	}
	if p, ok := x.pods[skip]; ok && p.counted {
		if u, governed := out[p.ns]; governed {
			addInPlace(u, p.uses, -1)
		}
	}
	if reserved == nil {
		return out
	}
	for uid, p := range x.pods {
		if p.counted || uid == skip {
			continue
		}
		if u, governed := out[p.ns]; governed && reserved(uid) {
			addInPlace(u, p.uses, 1)
		}
	}
	return out
}

// Handler is the pod informer handler that feeds the index.
func (x *QuotaIndex) Handler() toolscache.ResourceEventHandler {
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if p, ok := obj.(*corev1.Pod); ok {
				x.Set(p)
			}
		},
		UpdateFunc: func(_, obj any) {
			if p, ok := obj.(*corev1.Pod); ok {
				x.Set(p)
			}
		},
		DeleteFunc: func(obj any) {
			if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if p, ok := obj.(*corev1.Pod); ok {
				x.Delete(p.UID)
			}
		},
	}
}

// coversHold reports whether a namespace's own use has reached target
// (what it used plus what was held for it) or its min, so that the hold is
// no longer needed.
func coversHold(used, min, target quota.Resources) bool {
	for k, v := range target {
		if v > 0 && used[k] < min[k] && used[k] < v {
			return false
		}
	}
	return true
}

// Workloads groups pods into units of eviction: each gang whole (by
// api.GangOf), each other pod alone. A gang's priority is its members'
// highest, its creation its oldest member's.
func Workloads(pods []*corev1.Pod) []quota.Workload {
	byKey := map[string]*quota.Workload{}
	var keys []string
	for _, p := range pods {
		key, name := "pod/"+p.Namespace+"/"+p.Name, p.Name
		if g, ok, err := api.GangOf(p); ok && err == nil {
			key, name = "gang/"+g.Key(), "gang "+g.Name
		}
		prio := int32(0)
		if p.Spec.Priority != nil {
			prio = *p.Spec.Priority
		}
		w := byKey[key]
		if w == nil {
			w = &quota.Workload{Namespace: p.Namespace, Name: name, Priority: prio, Created: p.CreationTimestamp.Time, Uses: quota.Resources{}}
			byKey[key] = w
			keys = append(keys, key)
		}
		w.Priority = max(w.Priority, prio)
		if p.CreationTimestamp.Time.Before(w.Created) {
			w.Created = p.CreationTimestamp.Time
		}
		w.Uses = w.Uses.Add(PodQuotaUse(p))
		w.Pods = append(w.Pods, p.Name)
	}
	sort.Strings(keys)
	out := make([]quota.Workload, 0, len(keys))
	for _, k := range keys {
		w := byKey[k]
		sort.Strings(w.Pods)
		out = append(out, *w)
	}
	return out
}

// QuotaVerdict is quota's answer for a pod at filter.
type QuotaVerdict struct {
	Allowed bool
	// WithinMin: admitted without borrowing, so reclaim may make room.
	WithinMin bool
	Reason    Reason
	Message   string
	// Unresolvable: preemption cannot help (no lower-priority work of the
	// pod's own namespace whose removal would admit it).
	Unresolvable bool
}

// AdmitRequest decides whether namespace ns may start work of priority
// prio using req on view v, and explains a refusal precisely.
func AdmitRequest(v *QuotaView, ns string, prio int32, req quota.Resources, what string) QuotaVerdict {
	st := v.State
	d := st.Admit(ns, req)
	if d.Allowed {
		return QuotaVerdict{Allowed: true, WithinMin: !d.Borrowing, Message: d.Reason}
	}
	q := st.Quotas[ns]
	after := st.Used[ns].Add(req)
	out := QuotaVerdict{Reason: QuotaNotLendable}
	for _, name := range sortedResourceNames(req) {
		if m, capped := q.Max[name]; capped && after[name] > m {
			out.Reason = QuotaAboveMax
			out.Message = fmt.Sprintf("tessera: quota: %s asks for %d %s; namespace %s uses %d, its ElasticQuota max is %d", what, req[name], name, ns, st.Used[ns][name], m)
			break
		}
	}
	if out.Reason == QuotaNotLendable {
		total, lendable := quota.Resources{}, quota.Resources{}
		for n, qq := range st.Quotas {
			total = total.Add(st.Used[n])
			lendable = lendable.Add(qq.Min)
		}
		for k, c := range st.Capacity {
			lendable[k] = max(lendable[k], c)
		}
		for _, name := range sortedResourceNames(req) {
			if req[name] > 0 && total[name]+req[name] > lendable[name] {
				out.Message = fmt.Sprintf("tessera: quota: %s asks for %d %s; namespace %s would borrow above its min %d, but governed namespaces use %d of %d that can be lent", what, req[name], name, ns, q.Min[name], total[name], lendable[name])
				break
			}
		}
		if out.Message == "" {
			out.Message = "tessera: quota: " + d.Reason
		}
	}
	// Preemption helps only by lower-priority work of the same namespace
	// (CanPreempt refuses other namespaces' victims to work above min).
	relief := quota.Resources{}
	for _, p := range v.Pods {
		if p.Namespace == ns && podPriority(p) < prio {
			relief = relief.Add(PodQuotaUse(p))
		}
	}
	c := st.Clone()
	c.Used[ns] = c.Used[ns].Sub(relief)
	out.Unresolvable = !c.Admit(ns, req).Allowed
	return out
}

func podPriority(p *corev1.Pod) int32 {
	if p.Spec.Priority != nil {
		return *p.Spec.Priority
	}
	return 0
}

func sortedResourceNames(r quota.Resources) []corev1.ResourceName {
	out := make([]corev1.ResourceName, 0, len(r))
	for k := range r {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// PreemptVictims applies quota and gang rules to kube-scheduler's victims
// on one node for preemptor (asking req): a victim that is a gang member
// stays unless every live member of its gang is among the victims (the
// verb can only name pods of this node, so a gang spread over nodes is
// never broken), and a workload of another namespace goes only where
// quota.CanPreempt allows (the preemptor within its min, the victim's
// namespace staying at or above its own). It returns the victims allowed
// and the reasons of those dropped, by pod name.
func PreemptVictims(v *QuotaView, members func(gang *api.Gang) []*corev1.Pod, preemptor *corev1.Pod, req quota.Resources, victims []*corev1.Pod) (allowed []*corev1.Pod, dropped map[string]string) {
	dropped = map[string]string{}
	onNode := map[types.UID]bool{}
	for _, p := range victims {
		onNode[p.UID] = true
	}
	type unit struct {
		w    quota.Workload
		pods []*corev1.Pod
	}
	units := map[string]*unit{}
	var keys []string
	for _, p := range victims {
		key := "pod/" + p.Namespace + "/" + p.Name
		g, isGang, err := api.GangOf(p)
		if isGang && err == nil {
			key = "gang/" + g.Key()
		}
		if units[key] != nil {
			continue
		}
		pods := []*corev1.Pod{p}
		if isGang && err == nil {
			pods = nil
			whole := true
			for _, m := range members(g) {
				_, planned := m.Annotations[api.AnnotationGangPlan]
				if gpureq.Ended(m) || (m.Spec.NodeName == "" && !planned) {
					continue // not running: nothing to break
				}
				if !onNode[m.UID] {
					whole = false
				}
				pods = append(pods, m)
			}
			if !whole {
				for _, m := range victims {
					if mg, ok, err := api.GangOf(m); ok && err == nil && mg.Key() == g.Key() {
						dropped[m.Name] = fmt.Sprintf("member of gang %s, which has members on other nodes: preempting it would break the gang", g.Key())
					}
				}
				units[key] = &unit{}
				continue
			}
		}
		ws := Workloads(pods)
		units[key] = &unit{w: ws[0], pods: pods}
		keys = append(keys, key)
	}
	// Lowest priority first, as kube-scheduler would pick them.
	sort.SliceStable(keys, func(i, j int) bool { return units[keys[i]].w.Priority < units[keys[j]].w.Priority })
	st := v.State.Clone()
	for _, k := range keys {
		u := units[k]
		ok, why := st.CanPreempt(preemptor.Namespace, req, u.w)
		if !ok {
			for _, p := range u.pods {
				if onNode[p.UID] {
					dropped[p.Name] = why
				}
			}
			continue
		}
		if _, governed := st.Quotas[u.w.Namespace]; governed {
			st.Used[u.w.Namespace] = st.Used[u.w.Namespace].Sub(u.w.Uses)
		}
		allowed = append(allowed, u.pods...)
	}
	return allowed, dropped
}

// describeUse renders resources for messages, e.g. "16 tessera.dev/gpu".
func describeUse(r quota.Resources) string {
	var parts []string
	for _, k := range sortedResourceNames(r) {
		if r[k] != 0 {
			parts = append(parts, fmt.Sprintf("%d %s", r[k], k))
		}
	}
	if len(parts) == 0 {
		return "nothing"
	}
	return strings.Join(parts, ", ")
}
