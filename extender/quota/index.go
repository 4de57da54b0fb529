package quota

import (
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"

	core "github.com/tessera-gpu/tessera/allocator/quota"
	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/gpureq"
)

// Index keeps, from pod informer events, every pod's quota use and
// whether it counts (see Ledger.Counted), with the sums by namespace,
// so that admission at filter does not walk every pod.
type Index struct {
	mu   sync.RWMutex
	pods map[types.UID]indexedPod
	// used sums the counted pods by namespace.
	used map[string]core.Resources
}

type indexedPod struct {
	ns   string
	uses core.Resources
	// counted: bound or planned, live. Otherwise the pod is live and
	// unbound: it counts only while the GPU ledger holds a reservation
	// for it (a bind in flight).
	counted bool
	// booked: put there by a bind (Book), not by the informer yet.
	booked bool
}

// Set indexes a pod (added or updated).
func (x *Index) Set(pod *corev1.Pod) {
	uses := Use(pod)
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
		x.pods, x.used = map[types.UID]indexedPod{}, map[string]core.Resources{}
	}
	x.pods[pod.UID] = indexedPod{ns: pod.Namespace, uses: uses, counted: counted}
	if counted {
		x.used[pod.Namespace] = addInPlace(x.used[pod.Namespace], uses, 1)
	}
}

// Book counts pod, whose place a bind has just reserved in the GPU ledger,
// before the pod informer shows it: kube-scheduler has an informer of its
// own and may bind a pod of a burst before the extender's has added it,
// and quota then counted that pod for no later admission (a Deployment of
// 2-GPU pods scaled from 0 to 12 ran 7 under a max of 12 GPUs). The entry
// counts, as any unbound pod, only while the ledger holds the reservation
// (usedBy's reserved); the informer's first event of the pod replaces it.
// A pod the index knows already is left as it is.
func (x *Index) Book(pod *corev1.Pod) {
	uses := Use(pod)
	if len(uses) == 0 || gpureq.Ended(pod) {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if _, known := x.pods[pod.UID]; known {
		return
	}
	if x.pods == nil {
		x.pods, x.used = map[types.UID]indexedPod{}, map[string]core.Resources{}
	}
	x.pods[pod.UID] = indexedPod{ns: pod.Namespace, uses: uses, booked: true}
}

// Booked sums, for namespace ns, the pods booked at bind (Book) that the
// informer has not shown yet, less those in seen, while the ledger still
// reserves them: what a View built from the listers must add.
func (x *Index) Booked(ns string, seen map[types.UID]bool, reserved func(types.UID) bool) core.Resources {
	out := core.Resources{}
	if x == nil || reserved == nil {
		return out
	}
	x.mu.RLock()
	defer x.mu.RUnlock()
	for uid, p := range x.pods {
		if p.booked && p.ns == ns && !seen[uid] && reserved(uid) {
			addInPlace(out, p.uses, 1)
		}
	}
	return out
}

// Delete forgets a pod.
func (x *Index) Delete(uid types.UID) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.removeLocked(uid)
}

func (x *Index) removeLocked(uid types.UID) {
	old, ok := x.pods[uid]
	if !ok {
		return
	}
	delete(x.pods, uid)
	if old.counted {
		x.used[old.ns] = addInPlace(x.used[old.ns], old.uses, -1)
	}
}

func addInPlace(dst, r core.Resources, sign int64) core.Resources {
	if dst == nil {
		dst = core.Resources{}
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
func (x *Index) usedBy(quotas map[string]core.Quota, reserved func(types.UID) bool, skip types.UID) map[string]core.Resources {
	out := make(map[string]core.Resources, len(quotas))
	x.mu.RLock()
	defer x.mu.RUnlock()
	for ns := range quotas {
		out[ns] = core.Resources{}.Add(x.used[ns])
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
func (x *Index) Handler() toolscache.ResourceEventHandler {
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
