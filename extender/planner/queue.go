package planner

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/allocator/queue"
	"github.com/tessera-gpu/tessera/allocator/quota"
	"github.com/tessera-gpu/tessera/api"
	equota "github.com/tessera-gpu/tessera/extender/quota"
	"github.com/tessera-gpu/tessera/gpureq"
)

// ObjectSource gives the objects of a custom resource
// (extender.CRDWatcher).
type ObjectSource interface {
	Objects() []*unstructured.Unstructured
}

// QueueBook is the extender's view of the workload queues
// (tessera.dev/v1alpha1 Queue): the Queue objects (a CRDWatcher of
// api.QueueGVR), what each leaf queue's namespaces use and wait for (the
// pod informer), the cluster's capacity (the nodes' GPU capacity), and
// each queue's decayed usage history, kept in the Queue's status so that
// a restart keeps it (Run writes it).
type QueueBook struct {
	// Queues gives the Queue objects (a CRDWatcher of api.QueueGVR).
	Queues ObjectSource
	// Pods and Nodes list the informers' caches.
	Pods  func() ([]*corev1.Pod, error)
	Nodes func() ([]*corev1.Node, error)
	// HalfLife is the half-life of the usage history.
	HalfLife time.Duration
	// HistoryWeight is how much recent use lowers a queue's part of what
	// is lent (queue.State.HistoryWeight; 0: weights alone).
	HistoryWeight float64
	// Dynamic writes the Queues' status (Run); may be nil for a book that
	// only reads.
	Dynamic dynamic.Interface
	Now     func() time.Time

	mu     sync.Mutex
	logged map[string]string // queue (or "<queue> status") -> the reason last logged
	// decoded caches load's answer for the objects it was computed
	// from (their names and resource versions), with their tree.
	decoded struct {
		key  string
		objs queueObjects
		tree *queue.Tree
	}
}

func (b *QueueBook) now() time.Time {
	if b.Now != nil {
		return b.Now()
	}
	return time.Now()
}

// queueObjects are the decoded Queues.
type queueObjects struct {
	specs  []queue.Spec
	status map[string]api.QueueStatus
	objs   map[string]*unstructured.Unstructured
}

// load decodes the watcher's Queues. A malformed Queue is logged (once
// per error) and kept as a queue that admits nothing (every limit 0) for
// the namespaces it names, so that a broken object never lets its
// namespaces run unqueued. A malformed status only loses its history.
func (b *QueueBook) load() (queueObjects, *queue.Tree) {
	var objs []*unstructured.Unstructured
	if b.Queues != nil {
		objs = b.Queues.Objects()
	}
	keys := make([]string, len(objs))
	for i, u := range objs {
		keys[i] = u.GetName() + "@" + u.GetResourceVersion()
	}
	sort.Strings(keys)
	key := strings.Join(keys, ",")
	b.mu.Lock()
	if b.decoded.tree != nil && b.decoded.key == key {
		defer b.mu.Unlock()
		return b.decoded.objs, b.decoded.tree
	}
	b.mu.Unlock()
	out := b.decode(objs)
	tree := queue.Build(out.specs)
	for _, name := range tree.Names() {
		if why := tree.Invalid(name); why != "" {
			// A malformed Queue among them (its decoding error is its
			// reason), and a conflict between Queues, which is no error
			// of one object's decoding.
			b.logOnce(name, why, "Queue admits nothing new until it is fixed; its running work is kept (never reclaimed)", "queue", name, "reason", why)
		}
	}
	b.mu.Lock()
	b.decoded.key, b.decoded.objs, b.decoded.tree = key, out, tree
	b.mu.Unlock()
	return out, tree
}

// decode decodes Queue objects (load's work, without the cache).
func (b *QueueBook) decode(objs []*unstructured.Unstructured) queueObjects {
	out := queueObjects{status: map[string]api.QueueStatus{}, objs: map[string]*unstructured.Unstructured{}}
	for _, u := range objs {
		out.objs[u.GetName()] = u
		q, err := api.QueueFromUnstructured(u)
		if err != nil {
			ns, _, _ := unstructured.NestedStringSlice(u.Object, "spec", "namespaces")
			out.specs = append(out.specs, queue.Spec{Name: u.GetName(), Namespaces: ns, Malformed: err.Error()})
			continue
		}
		out.specs = append(out.specs, specOf(q))
		st, err := api.QueueStatusFromUnstructured(u)
		if err != nil {
			b.logOnce(u.GetName()+" status", err.Error(), "Malformed Queue status: the queue's usage history starts afresh", "queue", u.GetName(), "err", err)
			continue
		}
		out.status[q.Name] = st
	}
	sort.Slice(out.specs, func(i, j int) bool { return out.specs[i].Name < out.specs[j].Name })
	return out
}

// logOnce logs msg with kv the first time key holds value (a queue's
// reason to admit nothing, a status's error), not again on every pass.
func (b *QueueBook) logOnce(key, value, msg string, kv ...any) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.logged == nil {
		b.logged = map[string]string{}
	}
	if b.logged[key] != value {
		b.logged[key] = value
		klog.Background().Info(msg, kv...)
	}
}

// specOf is the pure core's view of a Queue.
func specOf(q *api.Queue) queue.Spec {
	sp := queue.Spec{Name: q.Name, Parent: q.Parent, Namespaces: q.Namespaces, Guaranteed: quota.Resources{}, Limit: quota.Resources{}, Weight: map[corev1.ResourceName]int64{}}
	for r, v := range q.Resources {
		sp.Guaranteed[r] = v.Guaranteed
		if v.Limited {
			sp.Limit[r] = v.Limit
		}
		sp.Weight[r] = v.Weight
	}
	return sp
}

// QueueSnapshot is the queues' state at one moment.
type QueueSnapshot struct {
	State *queue.State
	// Status is each Queue's status as last written.
	Status map[string]api.QueueStatus
	objs   map[string]*unstructured.Unstructured
}

// QueueOf returns the leaf queue serving namespace ns.
func (s *QueueSnapshot) QueueOf(ns string) (string, bool) {
	if s == nil || s.State == nil || s.State.Tree == nil {
		return "", false
	}
	return s.State.Tree.QueueOf(ns)
}

// Snapshot builds the queues' state now: used is what the served
// namespaces' pods bound or planned use, pending what their other pods
// wait for; the history is each leaf's status usage accrued to now.
func (b *QueueBook) Snapshot() (*QueueSnapshot, error) {
	objs, tree := b.load()
	snap := &QueueSnapshot{Status: objs.status, objs: objs.objs, State: &queue.State{
		Tree: tree, Used: map[string]quota.Resources{}, Pending: map[string]quota.Resources{}, Usage: map[string]queue.Usage{}, HalfLife: b.HalfLife,
		HistoryWeight: b.HistoryWeight,
	}}
	if len(objs.specs) == 0 {
		return snap, nil
	}
	nodes, err := b.Nodes()
	if err != nil {
		return nil, fmt.Errorf("listing nodes: %w", err)
	}
	snap.State.Capacity = equota.Capacity(nodes, func(n *corev1.Node) corev1.ResourceList { return n.Status.Capacity })
	pods, err := b.Pods()
	if err != nil {
		return nil, fmt.Errorf("listing pods: %w", err)
	}
	waiting := map[string]quota.Resources{} // workload key -> what it asks for
	leafOf := map[string]string{}
	capped := newCapCount()
	type pendingPod struct {
		q    string
		uses quota.Resources
	}
	var pend []*corev1.Pod
	pendOf := map[types.UID]pendingPod{}
	for _, p := range pods {
		q, ok := tree.QueueOf(p.Namespace)
		if !ok || gpureq.Ended(p) {
			continue
		}
		uses := gpureq.QuotaCount(p)
		if len(uses) == 0 {
			continue
		}
		if usesQueue(p) {
			snap.State.Used[q] = snap.State.Used[q].Add(uses)
			capped.running(p)
		} else {
			pend = append(pend, p)
			pendOf[p.UID] = pendingPod{q: q, uses: uses}
		}
	}
	for _, p := range capped.waitingUnderCap(pend) {
		pp := pendOf[p.UID]
		snap.State.Pending[pp.q] = snap.State.Pending[pp.q].Add(pp.uses)
		k := UnitOf(p)
		waiting[k], leafOf[k] = waiting[k].Add(pp.uses), pp.q
	}
	// Lending protects only waiting work that could start within its
	// queue's guarantee (queue.State.Waiting).
	snap.State.Waiting = map[string][]quota.Resources{}
	keys := make([]string, 0, len(waiting))
	for k := range waiting {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		snap.State.Waiting[leafOf[k]] = append(snap.State.Waiting[leafOf[k]], waiting[k])
	}
	now := b.now()
	for _, leaf := range tree.Leaves() {
		st, ok := objs.status[leaf]
		if !ok || st.UsageUpdated.IsZero() {
			continue
		}
		snap.State.Usage[leaf] = queue.Accrue(queue.Usage(st.Usage), snap.State.Used[leaf], elapsedSince(st.UsageUpdated, now), b.HalfLife)
	}
	return snap, nil
}

// capCount counts the running members of elastic gangs with a cap
// (api.AnnotationGangMaxMember), so that the members the cap holds back are
// not counted as waiting demand: they start only when a running member
// ends, and lending protection must not keep a guarantee for them.
type capCount map[string]int // gang key -> members bound or planned

func newCapCount() capCount { return capCount{} }

func cappedGang(p *corev1.Pod) (*api.Gang, bool) {
	g, ok, err := api.GangOf(p)
	return g, ok && err == nil && g.MaxMember > 0
}

func (c capCount) running(p *corev1.Pod) {
	if g, ok := cappedGang(p); ok {
		c[g.Key()]++
	}
}

// waitingUnderCap is pending without the members of capped gangs beyond
// their cap, taken in name order as the gang planner admits them
// (GangPlanner.underCap).
func (c capCount) waitingUnderCap(pending []*corev1.Pod) []*corev1.Pod {
	byGang := map[string][]*corev1.Pod{}
	gangs := map[string]*api.Gang{}
	var out []*corev1.Pod
	for _, p := range pending {
		g, ok := cappedGang(p)
		if !ok {
			out = append(out, p)
			continue
		}
		byGang[g.Key()] = append(byGang[g.Key()], p)
		gangs[g.Key()] = g
	}
	keys := make([]string, 0, len(byGang))
	for k := range byGang {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		members := byGang[k]
		sort.Slice(members, func(i, j int) bool { return members[i].Name < members[j].Name })
		out = append(out, members[:min(gangs[k].Room(c[k]), len(members))]...)
	}
	return out
}

// elapsedSince is now − t, 0 when t is in the future (a skewed clock).
func elapsedSince(t, now time.Time) time.Duration {
	if d := now.Sub(t); d > 0 {
		return d
	}
	return 0
}

// Queued reports whether namespace ns is served by a queue: its GPU pods
// are then admitted in queue order (the admission webhook gates them).
func (b *QueueBook) Queued(ns string) bool {
	_, tree := b.load()
	_, ok := tree.QueueOf(ns)
	return ok
}

// Run writes every Queue's status every period until ctx is done.
func (b *QueueBook) Run(ctx context.Context, period time.Duration) {
	logger := klog.FromContext(ctx)
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := b.WriteStatus(ctx); err != nil {
			logger.Info("Writing Queue status failed; retrying", "err", err)
		}
	}
}

// WriteStatus writes each Queue's status: used (its subtree's), its
// guarantee, its fair share, and its usage history accrued to now (a
// parent's is the sum of its leaves'). A Queue whose status changed
// meanwhile is written on the next pass (a conflict is not an error).
func (b *QueueBook) WriteStatus(ctx context.Context) error {
	if b.Dynamic == nil {
		return nil
	}
	snap, err := b.Snapshot()
	if err != nil {
		return err
	}
	st := snap.State
	if st.Tree == nil || len(snap.objs) == 0 {
		return nil
	}
	// Accrued to the whole second the status records (RFC 3339): to a
	// later instant, the part of a second past it was counted again by
	// the next write (an operator measured 86.8 GPU-seconds per 10 s for
	// 8 GPUs).
	now := b.now().UTC().Truncate(time.Second)
	fair := st.FairShare()
	statuses := b.statuses(snap, fair, now)
	var errs []error
	for name, status := range statuses {
		u := snap.objs[name].DeepCopy()
		u.Object["status"] = status.Object()
		_, err := b.Dynamic.Resource(api.QueueGVR).UpdateStatus(ctx, u, metav1.UpdateOptions{FieldManager: FieldManager})
		if err != nil && !apierrors.IsConflict(err) {
			errs = append(errs, fmt.Errorf("queue %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// statuses computes what WriteStatus writes, by queue.
func (b *QueueBook) statuses(snap *QueueSnapshot, fair map[string]quota.Resources, now time.Time) map[string]api.QueueStatus {
	st := snap.State
	tree := st.Tree
	out := map[string]api.QueueStatus{}
	used := map[string]quota.Resources{}
	usage := map[string]queue.Usage{}
	// Leaves first, then each parent sums its children (names in Build's
	// order do not say depth, so walk each leaf's path).
	for _, leaf := range tree.Leaves() {
		u := queue.Usage{}
		if prev, ok := snap.Status[leaf]; ok && !prev.UsageUpdated.IsZero() {
			u = queue.Accrue(queue.Usage(prev.Usage), st.Used[leaf], elapsedSince(prev.UsageUpdated, now), b.HalfLife)
		}
		for _, q := range tree.Path(leaf) {
			used[q] = used[q].Add(st.Used[leaf])
			sum := usage[q]
			if sum == nil {
				sum = queue.Usage{}
			}
			for r, v := range u {
				sum[r] += v
			}
			usage[q] = sum
		}
	}
	for _, name := range tree.Names() {
		if _, ok := snap.objs[name]; !ok {
			continue
		}
		sp, _ := tree.Spec(name)
		status := api.QueueStatus{Used: map[corev1.ResourceName]int64{}, Guaranteed: map[corev1.ResourceName]int64{}, FairShare: map[corev1.ResourceName]int64{},
			Usage: map[corev1.ResourceName]float64{}, UsageUpdated: now}
		for r, v := range used[name] {
			status.Used[r] = v
		}
		for r, v := range sp.Guaranteed {
			status.Guaranteed[r] = v
		}
		for r, v := range fair[name] {
			status.FairShare[r] = v
		}
		for r, v := range usage[name] {
			status.Usage[r] = v
		}
		out[name] = status
	}
	return out
}

// usesQueue reports whether pod's request counts as its queue's use (a
// Snapshot's Used): it has not ended, and it is bound or planned (a gang's
// plan, a reservation's, room held for it); otherwise it waits.
func usesQueue(pod *corev1.Pod) bool {
	_, planned := pod.Annotations[api.AnnotationGangPlan]
	return !gpureq.Ended(pod) && (pod.Spec.NodeName != "" || planned)
}
