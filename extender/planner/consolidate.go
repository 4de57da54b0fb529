package planner

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/tessera-gpu/tessera/allocator/consolidate"
	"github.com/tessera-gpu/tessera/allocator/gang"
	"github.com/tessera-gpu/tessera/api"
	equota "github.com/tessera-gpu/tessera/extender/quota"
	"github.com/tessera-gpu/tessera/gpureq"
	"github.com/tessera-gpu/tessera/internal/eligible"
)

// Consolidation (--consolidation, off by default): a whole-GPU workload of
// the planner (a gang, or a queued pod) that fits nowhere, though the
// cluster has the GPUs, because they are scattered, gets whole nodes or
// NVLink cliques by moving pods that consent to it: single pods (outside
// any gang) marked api.AnnotationPreemptible, owned by a controller that
// recreates them (a ReplicaSet, Job, StatefulSet or ReplicationController;
// not a DaemonSet, whose pods cannot go elsewhere). allocator/consolidate
// decides which (the fewest moves; none whose freed GPUs the workload's
// placement does not use; the moved pods must have room elsewhere), with
// the planner's own placement as the judge of "it fits" (the nodes a
// member's selectors exclude take moved pods, not the workload; its GPU
// model and other rules are the judge's). Each pod is first
// evicted with a dry run: one a PodDisruptionBudget protects is kept and
// the choice made again without it. Then the room they free is held for
// the workload in the ledger (consolidate_hold.go: before any pod leaves,
// so that their replacements go elsewhere, and until the workload is
// planned there, a plan made again on a stale snapshot included), the
// Eviction API evicts them, each with a Consolidated Event, and the
// workload is planned on that room (the members bind once the pods are
// gone), as queue reclaim does. Nothing more is moved for a workload
// while its room is held: consolidation never evicts twice for the same
// room.
//
// At most MovesPerMinute pods are moved in any minute; a workload that
// would need more is not consolidated for (half a consolidation frees
// room it cannot use). The moves are remembered in memory only: after a
// restart the extender counts a full minute's moves as made at its start,
// so the bound holds across restarts without state.
//
// Who is consolidated for follows the reservation rule: a workload that is
// due a reservation (--reservation-wait and the rest of
// ReservationConfig's rule); every whole-GPU workload that fits nowhere
// when reservations are off.

// EventConsolidated is the reason of the Event on a pod moved by
// consolidation; EventConsolidating the one on the workload's members.
const (
	EventConsolidated  = "Consolidated"
	EventConsolidating = "Consolidating"
)

// Consolidator moves pods for the planner's workloads (see above).
type Consolidator struct {
	Evicter Evicter
	// Events may be nil.
	Events EventRecorder
	// Clock defaults to the real clock.
	Clock clock.PassiveClock
	// MovesPerMinute bounds the pods moved in any minute (at least 1).
	MovesPerMinute int

	mu      sync.Mutex
	started time.Time
	recent  []time.Time
	moves   *prometheus.CounterVec
	// Short-lived hints (a restart loses them; the next pass sees the
	// pods leaving or gone): pods evicted in the last two minutes, counted
	// as leaving before the informer shows it, and pods a budget refused,
	// passed over for a minute.
	evicted Evictions
	blocked map[types.UID]time.Time
}

// NewConsolidator returns a consolidator; its budget starts spent (see
// above).
func NewConsolidator(evicter Evicter, events EventRecorder, clk clock.PassiveClock, movesPerMinute int) (*Consolidator, error) {
	if movesPerMinute < 1 {
		return nil, fmt.Errorf("consolidation: %d moves per minute: want 1 or more", movesPerMinute)
	}
	if clk == nil {
		clk = clock.RealClock{}
	}
	c := &Consolidator{Evicter: evicter, Events: events, Clock: clk, MovesPerMinute: movesPerMinute, started: clk.Now(),
		blocked: map[types.UID]time.Time{}}
	c.moves = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "tessera", Subsystem: "extender", Name: "consolidation_moves_total",
		Help: "Pods moved by consolidation (--consolidation), by result: evicted, or blocked (a PodDisruptionBudget refused the dry run; another choice was made without it).",
	}, []string{"result"})
	for _, r := range []string{"evicted", "blocked"} {
		c.moves.WithLabelValues(r)
	}
	return c, nil
}

// Collector is the consolidation counter, to register.
func (c *Consolidator) Collector() prometheus.Collector { return c.moves }

// budget is how many moves may be made now.
func (c *Consolidator) budget() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.Clock.Now()
	kept := c.recent[:0]
	for _, t := range c.recent {
		if now.Sub(t) < time.Minute {
			kept = append(kept, t)
		}
	}
	c.recent = kept
	if now.Sub(c.started) < time.Minute {
		return 0 // a full minute's moves may have been made before a restart
	}
	return consolidate.Budget(now, c.recent, c.MovesPerMinute)
}

// moved records the eviction of pod uid.
func (c *Consolidator) moved(uid types.UID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.Clock.Now()
	c.recent = append(c.recent, now)
	c.evicted.Add(uid, now)
}

// block passes pod uid over for a minute.
func (c *Consolidator) block(uid types.UID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.blocked[uid] = c.Clock.Now()
}

// hints are the pods evicted in the last two minutes and those passed
// over in the last minute.
func (c *Consolidator) hints() (evicted, blocked map[types.UID]bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.Clock.Now()
	evicted, blocked = c.evicted.Current(now), map[types.UID]bool{}
	for uid, at := range c.blocked {
		if now.Sub(at) >= time.Minute {
			delete(c.blocked, uid)
			continue
		}
		blocked[uid] = true
	}
	return evicted, blocked
}

// Movable reports whether pod may be moved by consolidation: bound, not
// ended (gpureq.Ended: terminal or being deleted), marked
// api.AnnotationPreemptible "true", outside any gang, owned by a
// controller that recreates it elsewhere, and placed by no rule about
// other pods (required pod affinity or anti-affinity, a topology spread
// constraint that is not ScheduleAnyway): where kube-scheduler may put
// such a pod's replacement depends on pods the consolidation model does
// not weigh, so it is not moved.
func Movable(pod *corev1.Pod) bool {
	if pod == nil || pod.Spec.NodeName == "" || gpureq.Ended(pod) || placedByOtherPods(pod) {
		return false
	}
	if pre, err := api.GetPreemptible(pod.Annotations); err != nil || !pre {
		return false
	}
	if _, gang, _ := api.GangOf(pod); gang {
		return false
	}
	ref := metav1.GetControllerOf(pod)
	if ref == nil {
		return false
	}
	switch ref.Kind {
	case "ReplicaSet", "Job", "StatefulSet", "ReplicationController":
		return true
	}
	return false
}

// placedByOtherPods reports a required pod affinity or anti-affinity term,
// or a topology spread constraint kube-scheduler enforces.
func placedByOtherPods(pod *corev1.Pod) bool {
	if a := pod.Spec.Affinity; a != nil {
		if a.PodAffinity != nil && len(a.PodAffinity.RequiredDuringSchedulingIgnoredDuringExecution) > 0 {
			return true
		}
		if a.PodAntiAffinity != nil && len(a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution) > 0 {
			return true
		}
	}
	for _, c := range pod.Spec.TopologySpreadConstraints {
		if c.WhenUnsatisfiable != corev1.ScheduleAnyway {
			return true
		}
	}
	return false
}

// consolidate moves pods so that workload key fits, when it is due and
// the moves are within budget: it evicts them and returns the workload's
// plan on the room they free (nil when none), and what to add to its
// waiting reason ("" for nothing).
func (p *GangPlanner) consolidate(ctx context.Context, key string, g *api.Gang, members []*corev1.Pod, demands []Demand, minMember int, snap Snapshot) (*gang.Plan, string) {
	c := p.consolidator
	if c == nil {
		return nil, ""
	}
	logger := klog.FromContext(ctx)
	if h := p.liveHold(key); h != nil {
		// The room its moves free is held for it, and plan() found it
		// does not fit there (yet): it waits; nothing more is moved for
		// it (freedHold).
		return nil, heldWait(h)
	}
	gpus := 0
	for _, d := range demands {
		if d.Whole() == 0 || d.AsksMIG() {
			return nil, "" // slices and MIG instances are not consolidated for
		}
		gpus += d.Whole()
	}
	if cfg := p.reservation; cfg.ReserveAfter > 0 {
		oldest := members[0].CreationTimestamp.Time
		for _, m := range members {
			if m.CreationTimestamp.Time.Before(oldest) {
				oldest = m.CreationTimestamp.Time
			}
		}
		due := cfg.due()
		if !due.Due(gpus, p.now().Sub(oldest), p.smallWaited(due.MinGPUs)) {
			return nil, ""
		}
	}
	// Pods already leaving (or evicted by consolidation, which the pass's
	// listing may not show yet) are gone for the decision: their room is
	// on its way, and the workload is planned on it when it fits there
	// (so a pass that plans again, or the next one, takes the room its
	// moves freed before anyone else).
	leaving, blocked := c.hints()
	if r := p.reserved[key]; r != nil {
		for _, uid := range r.uids {
			leaving[uid] = true // its reservation is its own room
		}
	}
	for _, st := range snap {
		for uid := range st.Occupants() {
			if pod := p.passPods[uid]; pod != nil && pod.DeletionTimestamp != nil {
				leaving[uid] = true
			}
		}
	}
	base := without(snap, leaving)
	fitsOn := func(s Snapshot) (*gang.Plan, bool) {
		grp, nodes := p.gangInput(s, g, members, demands, minMember, false)
		res, err := gang.PlanGroup(grp, nodes, p.policy)
		return res, err == nil
	}
	if res, ok := fitsOn(base); ok {
		return res, ""
	}
	budget := c.budget()
	if budget == 0 {
		return nil, ""
	}
	for try := 0; try < 3; try++ {
		view, podOf := p.consolidationView(base, g, members, blocked)
		goneOf := func(moves []consolidate.Move) map[types.UID]bool {
			gone := map[types.UID]bool{}
			for _, m := range moves {
				gone[types.UID(m.Pod)] = true
			}
			return gone
		}
		var w consolidate.Workload
		for _, d := range demands {
			r := d.Request(0, 0)
			w.Members = append(w.Members, d.Whole())
			w.CPUMilli = append(w.CPUMilli, r.CPUMilli)
			w.MemMiB = append(w.MemMiB, r.MemMiB)
			w.NVLink = w.NVLink || d.NeedsNVLink()
		}
		w.OneDomain = requiredLevel(p.levels, g) != ""
		plan, err := consolidate.Decide(view, w, budget, func(moves []consolidate.Move) bool {
			_, ok := fitsOn(without(base, goneOf(moves)))
			return ok
		})
		switch {
		case errors.Is(err, consolidate.ErrFits):
			return nil, "" // (fitsOn said otherwise above)
		case errors.Is(err, consolidate.ErrBudget):
			return nil, "consolidation: " + strings.TrimPrefix(err.Error(), "consolidate: ")
		case err != nil:
			logger.V(2).Info("No consolidation", "workload", key, "why", err)
			return nil, ""
		}
		// A dry run first: a pod a PodDisruptionBudget protects stays, and
		// the choice is made again without it.
		var pods []*corev1.Pod
		for _, m := range plan.Moves {
			pods = append(pods, podOf[types.UID(m.Pod)])
		}
		if refused, derr := equota.FirstRefused(ctx, c.Evicter.Evict, pods); refused != nil {
			blocked[refused.UID] = true
			c.block(refused.UID)
			c.moves.WithLabelValues("blocked").Inc()
			logger.Info("Consolidation passes over a pod it may not evict", "workload", key, "pod", klog.KObj(refused), "err", derr)
			continue
		}
		// The room is held for the workload before any pod leaves, so
		// that the moved pods' replacements, and anything else, go
		// elsewhere (freedHold); it is planned on the nodes as they are
		// now.
		gone := goneOf(plan.Moves)
		for uid := range leaving {
			gone[uid] = true
		}
		res, ok := p.holdFreed(ctx, key, g, members, gone, fitsOn)
		if !ok {
			return nil, ""
		}
		var names []string
		for _, pod := range pods {
			err := c.Evicter.Evict(ctx, pod, false)
			if apierrors.IsNotFound(err) {
				continue // gone already: its room is freed
			}
			if err != nil {
				logger.Info("Consolidation could not evict a pod", "workload", key, "pod", klog.KObj(pod), "err", err)
				// The pods evicted so far are leaving: the next pass
				// decides again with them gone, on the room as it is.
				p.releaseHold(key)
				return nil, fmt.Sprintf("consolidation: evicting %s/%s: %v", pod.Namespace, pod.Name, err)
			}
			c.moved(pod.UID)
			c.moves.WithLabelValues("evicted").Inc()
			names = append(names, pod.Namespace+"/"+pod.Name)
			if c.Events != nil {
				c.Events.Eventf(pod, corev1.EventTypeWarning, EventConsolidated,
					"tessera: evicted from node %s to consolidate (it is marked %s and its controller recreates it elsewhere): %s (%d whole GPUs) fits nowhere and gets room on nodes %s once the %d pods moved are gone",
					pod.Spec.NodeName, api.AnnotationPreemptible, key, gpus, strings.Join(placedOn(res), ", "), len(pods))
			}
		}
		msg := fmt.Sprintf("consolidation moves %s (%d of %d moves per minute) so that it fits on nodes %s", strings.Join(names, ", "), len(names), c.MovesPerMinute, strings.Join(placedOn(res), ", "))
		logger.Info("Consolidating", "workload", key, "moved", names, "nodes", placedOn(res))
		if c.Events != nil {
			for _, m := range members {
				c.Events.Eventf(m, corev1.EventTypeNormal, EventConsolidating, "tessera: %s", msg)
			}
		}
		return res, msg
	}
	return nil, ""
}

// placedOn are the nodes of a plan, sorted, once each.
func placedOn(res *gang.Plan) []string {
	seen := map[string]bool{}
	var out []string
	for _, pl := range res.Placements {
		if !seen[pl.Node] {
			seen[pl.Node] = true
			out = append(out, pl.Node)
		}
	}
	sort.Strings(out)
	return out
}

// requiredLevel is the lowest required topology level of the workload
// (its own levels, else the cluster's), "" when none.
func requiredLevel(cluster []gang.Level, g *api.Gang) string {
	levels := cluster
	if g.Levels != nil {
		levels = toGangLevels(g.Levels)
	}
	for _, l := range levels {
		if l.Required {
			return l.Key
		}
	}
	return ""
}

// mayRunOn is where pod, evicted and recreated, may run (Node.Accepts:
// its node affinity, tolerations and the GPU models of d, the node's
// cordon), each node judged once: the decision asks again for every plan
// it tries.
func mayRunOn(snap Snapshot, pod *corev1.Pod, d Demand) func(string) bool {
	allowed, models := eligible.For(pod), d.GPUModels()
	judged := map[string]bool{}
	return func(name string) bool {
		ok, done := judged[name]
		if !done {
			st, in := snap[name]
			// The consolidation model places GPUs by position, not by
			// NUMA node: a pod whose GPUs and CPUs must meet on one NUMA
			// node comes back only where that holds of any placement.
			ok = in && st.Accepts(allowed, models) && st.AlignsAnywhere(d)
			judged[name] = ok
		}
		return ok
	}
}

// consolidationView is the ledger of snap as allocator/consolidate sees
// it: a pod is named by its UID; podOf maps movable pods back. Pods of
// blocked are not movable.
func (p *GangPlanner) consolidationView(snap Snapshot, g *api.Gang, members []*corev1.Pod, blocked map[types.UID]bool) ([]consolidate.Node, map[types.UID]*corev1.Pod) {
	names := make([]string, 0, len(snap))
	for n, st := range snap {
		if st.Usable() {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	level := requiredLevel(p.levels, g)
	podOf := map[types.UID]*corev1.Pod{}
	out := make([]consolidate.Node, 0, len(names))
	allowed := make([]eligible.Pod, len(members))
	for i, m := range members {
		allowed[i] = eligible.For(m)
	}
	for _, n := range names {
		st := snap[n]
		node := consolidate.Node{Name: n, GPUs: st.GPUCount(), Cliques: st.Cliques(), Unknown: st.PendingWholeGPUs(), Eligible: true}
		node.CPUMilli, node.MemMiB = st.FreeCPUMem()
		for _, a := range allowed {
			if !st.Admits(a) {
				node.Eligible = false
			}
		}
		if level != "" {
			d, ok := st.Labels()[level]
			if level == corev1.LabelHostname && !ok {
				d, ok = n, true
			}
			node.Domain = d
			node.Eligible = node.Eligible && ok
		}
		on := map[types.UID][]int{}
		for pos := range st.GPUCount() {
			for _, uid := range st.GPUPods(pos) {
				on[uid] = append(on[uid], pos)
			}
			if !st.Healthy(pos) {
				node.Pods = append(node.Pods, consolidate.Pod{Name: "unhealthy", GPUs: []int{pos}})
			}
		}
		uids := make([]types.UID, 0, len(on))
		for uid := range on {
			uids = append(uids, uid)
		}
		sort.Slice(uids, func(a, b int) bool { return uids[a] < uids[b] })
		for _, uid := range uids {
			pod := p.passPods[uid]
			movable := !blocked[uid] && Movable(pod)
			cp := consolidate.Pod{Name: string(uid), GPUs: on[uid], Movable: movable}
			if movable {
				d, err := p.ledger.ParseDemand(pod)
				if err != nil {
					cp.Movable = false // (it would not be placed again)
				} else {
					r := d.Request(0, 0)
					cp.CPUMilli, cp.MemMiB, cp.NVLink = r.CPUMilli, r.MemMiB, d.NeedsNVLink()
					podOf[uid] = pod
					cp.MayRunOn = mayRunOn(snap, pod, d)
				}
			}
			node.Pods = append(node.Pods, cp)
		}
		out = append(out, node)
	}
	return out, podOf
}
