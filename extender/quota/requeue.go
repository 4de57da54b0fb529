package quota

import (
	"context"
	"fmt"
	"maps"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/util/flowcontrol"
	"k8s.io/klog/v2"

	core "github.com/tessera-gpu/tessera/allocator/quota"
	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/gpureq"
)

// Applied is what governs a namespace: the quota in force and the object
// it comes from ("namespace/name@resourceVersion").
type Applied struct {
	Quota  core.Quota
	Object string
}

// Snapshot is what governs each governed namespace.
type Snapshot map[string]Applied

// Notice is what to tell on an ElasticQuota object that is not enforced as
// written: ignored (another applies) or invalid (it applies and admits
// nothing).
type Notice struct {
	Object *unstructured.Unstructured
	// Reason is api.EventQuotaIgnored or api.EventQuotaInvalid.
	Reason, Message string
}

// told is the key under which a notice is told once: the object's UID and
// resourceVersion with what is said, so a resync or a relist, which changes
// neither, says nothing again.
func (n Notice) told() string {
	return string(n.Object.GetUID()) + "@" + n.Object.GetResourceVersion() + " " + n.Reason + ": " + n.Message
}

// Snap decodes the ElasticQuota objects (Decode) into what governs each
// namespace, and the notices to tell on the objects that are not enforced
// as written. It is pure; objs is not modified.
func Snap(objs []*unstructured.Unstructured) (Snapshot, []Notice) {
	objs = append([]*unstructured.Unstructured(nil), objs...)
	quotas, errs := Decode(objs) // sorted by namespace and name
	snap := Snapshot{}
	var notices []Notice
	for _, u := range objs {
		ns := u.GetNamespace()
		key := ns + "/" + u.GetName()
		err := errs[key]
		if ign, ok := err.(*IgnoredError); ok {
			notices = append(notices, Notice{Object: u, Reason: api.EventQuotaIgnored,
				Message: fmt.Sprintf("ignored: namespace %s already has an ElasticQuota, %s, which applies (of several in a namespace the first by name applies); delete this one or merge it into %s%s",
					ns, ign.Applies, ign.Applies, malformedToo(ign.Malformed))})
			continue
		}
		snap[ns] = Applied{Quota: quotas[ns], Object: key + "@" + u.GetResourceVersion()}
		if err != nil {
			notices = append(notices, Notice{Object: u, Reason: api.EventQuotaInvalid,
				Message: fmt.Sprintf("%v; namespace %s admits nothing new under it until it is fixed", err, ns)})
		}
	}
	return snap, notices
}

func malformedToo(err error) string {
	if err == nil {
		return ""
	}
	return fmt.Sprintf(" (it is malformed too: %v)", err)
}

// Requeues decides, for a change of the ElasticQuotas in force from before
// to after, whose waiting pods may now be admitted: it returns, by
// namespace, the value of api.AnnotationQuotaRequeue to write on the
// namespace's unschedulable pods. Only a change that may admit more counts
// (Admit's rules):
//   - for the namespace itself: its quota deleted (nothing is refused
//     then), an invalid one fixed, a max raised or removed, a min raised;
//   - for every other governed namespace as well: the namespace's quota
//     deleted (its use no longer counts against what can be lent) or a
//     min raised (what can be lent may grow).
//
// A quota created where there was none, a max or min lowered, a quota made
// invalid, or a change of an object that does not apply (ignored, or the
// same quota written again) requeues nothing. The value names the changes
// ("ns/name@resourceVersion", "... deleted" for a quota removed), so a
// change is written once.
func Requeues(before, after Snapshot) map[string]string {
	causes := map[string]map[string]bool{}
	add := func(ns, cause string) {
		if causes[ns] == nil {
			causes[ns] = map[string]bool{}
		}
		causes[ns][cause] = true
	}
	names := map[string]bool{}
	for ns := range before {
		names[ns] = true
	}
	for ns := range after {
		names[ns] = true
	}
	for ns := range names {
		b, had := before[ns]
		a, has := after[ns]
		var own, others bool
		var cause string
		switch {
		case !had:
			continue // newly governed: admits no more than before
		case !has:
			own, others, cause = true, true, b.Object+" deleted"
		case sameQuota(a.Quota, b.Quota):
			continue
		default:
			cause = a.Object
			minUp := raised(b.Quota.Min, a.Quota.Min, false)
			own = a.Quota.Invalid == "" && (b.Quota.Invalid != "" || minUp || raised(b.Quota.Max, a.Quota.Max, true))
			others = minUp
		}
		if own {
			add(ns, cause)
		}
		if others {
			for other := range after {
				if other != ns {
					add(other, cause)
				}
			}
		}
	}
	out := map[string]string{}
	for ns, set := range causes {
		list := make([]string, 0, len(set))
		for c := range set {
			list = append(list, c)
		}
		sort.Strings(list)
		if len(list) > 3 {
			list = append(list[:3], fmt.Sprintf("and %d more", len(list)-3))
		}
		out[ns] = strings.Join(list, ", ")
	}
	return out
}

func sameQuota(a, b core.Quota) bool {
	return a.Namespace == b.Namespace && a.Invalid == b.Invalid && maps.Equal(a.Min, b.Min) && maps.Equal(a.Max, b.Max)
}

// raised reports whether after allows more than before of some resource:
// a larger value, or (for a max, where a missing resource is not capped)
// a resource no longer named.
func raised(before, after core.Resources, isMax bool) bool {
	for k, v := range after {
		if w, ok := before[k]; (ok || !isMax) && v > w {
			return true
		}
	}
	if isMax {
		for k := range before {
			if _, ok := after[k]; !ok {
				return true
			}
		}
	}
	return false
}

// Waiting reports whether an ElasticQuota change should requeue pod for
// value: a pod that kube-scheduler found unschedulable (PodScheduled
// False/Unschedulable: it waits in kube-scheduler's unschedulable pool,
// where nothing but a cluster event or the periodic flush moves it),
// pending, unbound, not gated, not planned, asking for a resource quota
// governs, and not written for this change already.
func Waiting(pod *corev1.Pod, value string) bool {
	if !gpureq.PendingUnschedulable(pod) || len(Use(pod)) == 0 {
		return false
	}
	v, ok := api.QuotaRequeue(pod.Annotations)
	return !ok || v != value
}

// Requeuer makes the pods an ElasticQuota change may now admit retry at
// once, and tells on each ElasticQuota that is not enforced as written
// (ignored or invalid) why, with a Warning Event on the object.
//
// kube-scheduler does not watch ElasticQuotas: a pod the extender refused
// for quota sits in its unschedulable pool until some cluster event or
// its periodic flush (podMaxInUnschedulablePodsDuration, 5 minutes). A
// change of the pod's metadata is such an event (k8s.io/kubernetes
// pkg/scheduler/backend/queue PriorityQueue.Update: the extender's
// rejection makes every pod update worth requeuing; without queueing
// hints, isPodUpdated counts metadata and not status), so the Requeuer
// writes api.AnnotationQuotaRequeue on those pods, at most Rate writes a
// second, outside every lock.
type Requeuer struct {
	Store Store
	// Pods lists a namespace's pods (the informer's lister).
	Pods func(ns string) ([]*corev1.Pod, error)
	// Patch applies a JSON merge patch to a pod.
	Patch func(ctx context.Context, ns, name string, patch []byte) error
	// Events may be nil.
	Events EventRecorder
	// Rate bounds the pod writes per second (default 20, burst as many).
	Rate float64
	// Settle is how long after a change the namespace's pods that turn
	// unschedulable are still written (default 15s): a pod refused
	// under the old quota just before the change is marked unschedulable
	// by kube-scheduler only after it.
	Settle time.Duration
	Now    func() time.Time

	mu      sync.Mutex
	synced  bool
	last    Snapshot
	told    map[string]string  // object key -> Notice.told of the last notice
	pending map[string]pending // namespace -> the change to write
	limiter flowcontrol.RateLimiter
}

type pending struct {
	value string
	until time.Time
	// refused: only the pods quota refused (RefusedByQuota), in every
	// namespace: the start's requeue, which does not know what changed.
	refused bool
}

func (r *Requeuer) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

// Run syncs at once, then on every signal of changed (the ElasticQuota
// watcher's OnChange) and, while writes are pending, every second, until
// ctx is done. Call it once the store has synced: the first sync is the
// baseline, and requeues the pods quota refused (see Sync).
func (r *Requeuer) Run(ctx context.Context, changed <-chan struct{}) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	r.Sync(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case <-changed:
			r.Sync(ctx)
		case <-t.C:
			if r.Pending() {
				r.Sync(ctx)
			}
		}
	}
}

// Pending reports whether a change still has pods to write, or may.
func (r *Requeuer) Pending() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.pending) > 0
}

// Sync reads the ElasticQuotas, tells the new notices, and writes the
// pending changes on the pods that wait (Waiting). The first call takes
// the quotas as they are for the baseline and requeues, in every
// namespace, the waiting pods quota refused (RefusedByQuota): what changed
// while no Requeuer ran (the extender restarting) is unknown, and a quota
// raised meanwhile left them waiting for kube-scheduler's flush (an
// operator raised a max while the extender was down: 94 s after its
// restart the pods still waited). Calls must not overlap (Run makes them
// one after the other).
func (r *Requeuer) Sync(ctx context.Context) {
	logger := klog.FromContext(ctx)
	snap, notices := Snap(r.Store.Objects())
	now := r.now()
	settle := r.Settle
	if settle <= 0 {
		settle = 15 * time.Second
	}

	r.mu.Lock()
	if r.told == nil {
		r.told, r.pending = map[string]string{}, map[string]pending{}
		rate := r.Rate
		if rate <= 0 {
			rate = 20
		}
		r.limiter = flowcontrol.NewTokenBucketRateLimiter(float32(rate), max(1, int(rate)))
	}
	if r.synced {
		for ns, value := range Requeues(r.last, snap) {
			r.pending[ns] = pending{value: value, until: now.Add(settle)}
		}
	} else {
		// One pass (retried only when a write fails): the pods refused
		// from now on are refused under the quotas in force.
		r.pending[corev1.NamespaceAll] = pending{value: "extender start " + now.UTC().Format(time.RFC3339Nano), until: now, refused: true}
	}
	r.last, r.synced = snap, true
	var tell []Notice
	seen := map[string]bool{}
	for _, n := range notices {
		key := n.Object.GetNamespace() + "/" + n.Object.GetName()
		seen[key] = true
		if r.told[key] != n.told() {
			r.told[key] = n.told()
			tell = append(tell, n)
		}
	}
	for key := range r.told {
		if !seen[key] {
			delete(r.told, key) // enforced now, or gone
		}
	}
	work := maps.Clone(r.pending)
	limiter := r.limiter
	r.mu.Unlock()

	for _, n := range tell {
		logger.V(2).Info("ElasticQuota not enforced as written", "quota", klog.KObj(n.Object), "reason", n.Reason, "message", n.Message)
		if r.Events != nil {
			obj := n.Object.DeepCopy()
			if obj.GetKind() == "" {
				obj.SetAPIVersion(api.ElasticQuotaGVR.GroupVersion().String())
				obj.SetKind("ElasticQuota")
			}
			r.Events.Eventf(obj, corev1.EventTypeWarning, n.Reason, "%s", n.Message)
		}
	}

	nss := make([]string, 0, len(work))
	for ns := range work {
		nss = append(nss, ns)
	}
	sort.Strings(nss)
	for _, ns := range nss {
		p := work[ns]
		failed := r.requeue(ctx, ns, p, limiter)
		if !failed && !now.Before(p.until) {
			r.mu.Lock()
			if r.pending[ns] == p {
				delete(r.pending, ns)
			}
			r.mu.Unlock()
		}
	}
}

// requeue writes job's value on the waiting pods of ns (all namespaces
// for ""; only those quota refused when job.refused); it reports whether a
// write failed (to be tried again on the next sync).
func (r *Requeuer) requeue(ctx context.Context, ns string, job pending, limiter flowcontrol.RateLimiter) (failed bool) {
	value := job.value
	logger := klog.FromContext(ctx)
	pods, err := r.Pods(ns)
	if err != nil {
		logger.Info("Listing pods to requeue after an ElasticQuota change", "namespace", ns, "err", err)
		return true
	}
	sort.Slice(pods, func(i, j int) bool { return pods[i].Name < pods[j].Name })
	patch := api.QuotaRequeuePatch(value)
	for _, p := range pods {
		if !Waiting(p, value) || job.refused && !RefusedByQuota(p) {
			continue
		}
		if err := limiter.Wait(ctx); err != nil {
			return true
		}
		if err := r.Patch(ctx, p.Namespace, p.Name, patch); err != nil {
			if !apierrors.IsNotFound(err) {
				logger.Info("Requeuing a pod after an ElasticQuota change", "pod", klog.KObj(p), "change", value, "err", err)
				failed = true
			}
			continue
		}
		logger.V(2).Info("Requeued a pod after an ElasticQuota change", "pod", klog.KObj(p), "change", value)
	}
	return failed
}
