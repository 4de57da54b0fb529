package extender

import (
	"context"
	"fmt"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/allocator"
	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/extender/planner"
	equota "github.com/tessera-gpu/tessera/extender/quota"
	"github.com/tessera-gpu/tessera/internal/eligible"
)

// QuotaHooks is what the verbs ask of quota.
type QuotaHooks interface {
	// AdmitPod decides whether the pod's namespace may take what the pod
	// asks for.
	AdmitPod(ctx context.Context, pod *corev1.Pod) equota.Verdict
	// NoRoom says that a pod admitted within its namespace's min fits no
	// node: reclaim may make room (asynchronously).
	NoRoom(pod *corev1.Pod)
	// PreemptVictims keeps, of kube-scheduler's victims on a node, those
	// quota and gangs allow, and says which of them are extra members of
	// elastic gangs; ok is false when the node is no candidate (a victim
	// the scheduler needs for CPU or memory may not go).
	PreemptVictims(ctx context.Context, pod *corev1.Pod, st *NodeState, victims []types.UID) (kept []types.UID, extra map[types.UID]bool, ok bool)
	// NodeExtras returns the extra members of elastic gangs (beyond their
	// minMember) on the node of state st, of a lower priority than pod,
	// the newest first, whose gangs have no member among victims: the
	// preempt verb offers them beside kube-scheduler's victims.
	NodeExtras(pod *corev1.Pod, st *NodeState, victims []types.UID) []types.UID
	// AdmitsWithout reports whether quota admits the pod once the victims
	// (pods of node state st) are gone.
	AdmitsWithout(ctx context.Context, pod *corev1.Pod, st *NodeState, victims []types.UID) bool
	// Book counts pod, whose place a bind (or Reserve) has just reserved
	// in the ledger, from now on, before the pod informer shows it.
	Book(pod *corev1.Pod)
}

// QuotaNodes is the GPU ledger as quota reclaim sees it (quota.Nodes).
type QuotaNodes struct {
	Cache *Cache
}

var (
	_ equota.Nodes   = QuotaNodes{}
	_ equota.Evicter = (*KubeEvicter)(nil)
	_ equota.Metrics = (*Metrics)(nil)
	_ equota.Store   = (*CRDWatcher)(nil)
)

// Tracks reports whether the ledger still counts the pod.
func (n QuotaNodes) Tracks(uid types.UID) bool {
	_, ok := n.Cache.PodUse(uid)
	return ok
}

// PodFits tests whether pod fits a node it may go to (package eligible:
// its node selector and affinity, the node's taints and cordon), so that
// reclaim never frees room on nodes the pod can never use.
func (n QuotaNodes) PodFits(pod *corev1.Pod) (equota.Fits, error) {
	d, err := ParseDemand(pod)
	if err != nil {
		return nil, err
	}
	allowed := eligible.For(pod)
	fits := func(snap map[string]*NodeState) bool {
		for _, st := range snap {
			if st.Admits(allowed) && Check(st, &d) == Fits {
				return true
			}
		}
		return false
	}
	return n.Fits(fits), nil
}

// Fits turns a test on node states into reclaim's: the ledger is read
// when reclaim decides, without the pods leaving, and each choice of
// victims is tested on it.
func (n QuotaNodes) Fits(fits func(map[string]*NodeState) bool) equota.Fits {
	return func(gone map[types.UID]bool) func(map[types.UID]bool) bool {
		base := without(n.Cache.Snapshot(), gone)
		return func(victims map[types.UID]bool) bool { return fits(without(base, victims)) }
	}
}

// QuotaRoom is QuotaNodes that also holds the room ElasticQuota reclaim
// frees for a pending pod outside any gang (equota.RoomHolder): before the
// victims are evicted, a sealed plan on the pod names the node where it
// fits once they are gone, and its GPUs (HoldPlan), so that no other pod
// takes them meanwhile, a namespace within its min included (the quota
// hold alone keeps out only borrowers). The plan is released, as tier
// preemption's, when it expires unused (Preemptor): use it only where a
// Preemptor runs.
type QuotaRoom struct {
	QuotaNodes
	Policy allocator.Policy
	Plans  PlanWriter
}

var _ equota.RoomHolder = QuotaRoom{}

// HoldRoom writes pod's plan on the node where it fits once the pods gone
// have left and not before (the room they free), of those the most of
// them leave, then by name.
func (r QuotaRoom) HoldRoom(ctx context.Context, pod *corev1.Pod, gone map[types.UID]bool, expires time.Time) (string, error) {
	if _, member, _ := api.GangOf(pod); member {
		// Its gang's plan holds a member's room (the planner's).
		return "", fmt.Errorf("%s/%s is a gang member: no room is held for it alone", pod.Namespace, pod.Name)
	}
	d, err := ParseDemand(pod)
	if err != nil {
		return "", err
	}
	allowed := eligible.For(pod)
	snap := r.Cache.Snapshot()
	names := make([]string, 0, len(snap))
	for n := range snap {
		names = append(names, n)
	}
	sort.Strings(names)
	most := -1
	var after *NodeState
	for _, n := range names {
		st := snap[n]
		freed := 0
		for uid := range st.Pods {
			if gone[uid] {
				freed++
			}
		}
		if freed == 0 || freed <= most || !st.Admits(allowed) || Check(st, &d) == Fits {
			continue
		}
		if a := st.without(gone); Check(a, &d) == Fits {
			most, after = freed, a
		}
	}
	if after == nil {
		return "", fmt.Errorf("no node has room for %s/%s once the pods reclaimed for it are gone", pod.Namespace, pod.Name)
	}
	plan, err := HoldPlan(r.Policy, after, pod, &d, expires)
	if err != nil {
		return "", err
	}
	ann := map[string]string{}
	if err := api.SetGangPlan(ann, plan); err != nil {
		return "", err
	}
	if err := r.Plans.SetPlan(ctx, pod, ann[api.AnnotationGangPlan]); err != nil {
		return "", fmt.Errorf("writing the plan of %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return plan.Where(), nil
}

// Quota binds quota's Enforcer to the GPU ledger: it is the verbs'
// QuotaHooks and the gang planner's planner.GangQuota.
type Quota struct {
	Enforcer *equota.Enforcer
	Nodes    QuotaNodes
}

var _ QuotaHooks = (*Quota)(nil)

// AdmitPod is Enforcer.AdmitPod.
func (q *Quota) AdmitPod(ctx context.Context, pod *corev1.Pod) equota.Verdict {
	return q.Enforcer.AdmitPod(ctx, pod)
}

// NoRoom is Enforcer.NoRoom.
func (q *Quota) NoRoom(pod *corev1.Pod) { q.Enforcer.NoRoom(pod) }

// PreemptVictims is Enforcer.PreemptVictims on the victims as node state
// st counts them; on a node the ledger does not know, every victim stays.
func (q *Quota) PreemptVictims(ctx context.Context, pod *corev1.Pod, st *NodeState, victims []types.UID) ([]types.UID, map[types.UID]bool, bool) {
	if st == nil {
		return victims, nil, true
	}
	vs := make([]equota.Victim, len(victims))
	for i, uid := range victims {
		vs[i] = victimOf(st, uid)
	}
	return q.Enforcer.PreemptVictims(ctx, pod, vs)
}

// victimOf is the pod uid as node state st counts it.
func victimOf(st *NodeState, uid types.UID) equota.Victim {
	v := equota.Victim{UID: uid}
	if u, ok := st.Pods[uid]; ok {
		v.Namespace, v.Name = u.Namespace, u.Name
		v.GPUs = u.HoldsGPUs()
	}
	return v
}

// NodeExtras is Enforcer.NodeExtras on the GPU pods node state st counts
// (the ones that are not leaving).
func (q *Quota) NodeExtras(pod *corev1.Pod, st *NodeState, victims []types.UID) []types.UID {
	if st == nil {
		return nil
	}
	var on []equota.Victim
	for uid, u := range st.Pods {
		if v := victimOf(st, uid); v.GPUs && !u.Leaving && !u.Planned {
			on = append(on, v)
		}
	}
	return q.Enforcer.NodeExtras(pod, on, victims)
}

// Book is the quota Index's Book (nothing without an index).
func (q *Quota) Book(pod *corev1.Pod) {
	if q.Enforcer.Ledger != nil && q.Enforcer.Ledger.Index != nil {
		q.Enforcer.Ledger.Index.Book(pod)
	}
}

// AdmitsWithout is Enforcer.AdmitsWithout.
func (q *Quota) AdmitsWithout(ctx context.Context, pod *corev1.Pod, _ *NodeState, victims []types.UID) bool {
	return q.Enforcer.AdmitsWithout(ctx, pod, victims)
}

// AdmitGang is Enforcer.AdmitGang.
func (q *Quota) AdmitGang(ctx context.Context, ns string, members []*corev1.Pod) equota.Verdict {
	return q.Enforcer.AdmitGang(ctx, ns, members)
}

// ReclaimFor is Enforcer.Choose with the planner's test on node states:
// it evicts nothing itself, and returns the reclaim's message, the pods
// gone once the room is free, and its eviction (nil without victims).
func (q *Quota) ReclaimFor(ctx context.Context, ns string, askers []*corev1.Pod, fits func(planner.Snapshot) bool) (string, map[types.UID]bool, func(context.Context) error, error) {
	r, err := q.Enforcer.Choose(ctx, ns, askers, q.Nodes.Fits(func(s map[string]*NodeState) bool { return fits(plannerSnapshot(s)) }))
	if err != nil {
		return "", nil, nil, err
	}
	if !r.Victims() {
		return r.Msg, r.Gone, nil, nil
	}
	return r.Msg, r.Gone, r.Evict, nil
}
