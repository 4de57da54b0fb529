package extender

import (
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/types"

	corev1 "k8s.io/api/core/v1"

	"github.com/tessera-gpu/tessera/allocator"
	"github.com/tessera-gpu/tessera/allocator/gang"
	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/extender/planner"
	"github.com/tessera-gpu/tessera/internal/eligible"
)

// The planner (package extender/planner) reaches the ledger only through
// planner.Ledger, planner.Node and planner.Demand; this file binds them to
// the Cache, NodeState and Demand.

var (
	_ planner.Ledger         = PlannerLedger{}
	_ planner.Node           = (*NodeState)(nil)
	_ planner.Demand         = (*Demand)(nil)
	_ planner.GangQuota      = (*Quota)(nil)
	_ planner.TierPreempt    = (*Preemptor)(nil)
	_ planner.Evicter        = (*KubeEvicter)(nil)
	_ planner.ReclaimMetrics = (*Metrics)(nil)
	_ planner.ObjectSource   = (*CRDWatcher)(nil)
)

// PlannerLedger is the Cache as the planner reads and reserves it
// (planner.Ledger).
type PlannerLedger struct {
	Cache *Cache
}

// Snapshot is Cache.Snapshot.
func (l PlannerLedger) Snapshot() planner.Snapshot { return plannerSnapshot(l.Cache.Snapshot()) }

// Node is Cache.Node.
func (l PlannerLedger) Node(name string) (planner.Node, bool) {
	st, ok := l.Cache.Node(name)
	if !ok {
		return nil, false
	}
	return st, true
}

// ReserveGang is Cache.ReserveGang of the uses as PlannedPodUse counts
// them, each holding its WholePending whole GPUs.
func (l PlannerLedger) ReserveGang(snap planner.Snapshot, uses []*planner.Use) error {
	states := make(map[string]*NodeState, len(uses))
	pus := make([]*PodUse, len(uses))
	for i, u := range uses {
		// The snapshot's nodes are the states this ledger gave out (or
		// built from them): another is a state the cache never held.
		st, _ := snap[u.Node].(*NodeState)
		states[u.Node] = st
		pu := PlannedPodUse(u.Pod, &u.Plan)
		pu.WholePending = u.WholePending
		pus[i] = pu
	}
	return l.Cache.ReserveGang(states, pus)
}

// ReleaseGang is Cache.ReleaseGang.
func (l PlannerLedger) ReleaseGang(uids []types.UID) { l.Cache.ReleaseGang(uids) }

// Holds is Cache.PodUse as the planner reads it.
func (l PlannerLedger) Holds(uid types.UID) (planner.Held, bool) {
	u, ok := l.Cache.PodUse(uid)
	if !ok {
		return planner.Held{}, false
	}
	h := planner.Held{Node: u.Node, Planned: u.Planned, Pending: u.WholePending, Malformed: u.Err != nil}
	h.GPUs = append(h.GPUs, u.Whole...)
	h.GPUs = append(h.GPUs, u.PlannedWhole...)
	for _, s := range u.Shared {
		h.GPUs = append(h.GPUs, s.UUID)
	}
	return h, true
}

// ParseDemand is ParseDemand.
func (l PlannerLedger) ParseDemand(pod *corev1.Pod) (planner.Demand, error) {
	d, err := ParseDemand(pod)
	if err != nil {
		return nil, err
	}
	return &d, nil
}

// Planned is PlannedPodUse.
func (l PlannerLedger) Planned(member *corev1.Pod, plan *api.GangPlan) *planner.Use {
	u := PlannedPodUse(member, plan)
	return &planner.Use{UID: u.UID, Node: u.Node, WholePending: u.WholePending, Pod: member, Plan: *plan}
}

// plannerSnapshot is snap as the planner reads it.
func plannerSnapshot(snap map[string]*NodeState) planner.Snapshot {
	out := make(planner.Snapshot, len(snap))
	for n, st := range snap {
		out[n] = st
	}
	return out
}

// demandsOf are the Demands behind the planner's (PlannerLedger.ParseDemand
// made them).
func demandsOf(ds []planner.Demand) []Demand {
	out := make([]Demand, len(ds))
	for i, d := range ds {
		out[i] = *d.(*Demand)
	}
	return out
}

// Name is the node's name.
func (s *NodeState) Name() string { return s.Info.Name }

// Labels are the node's labels.
func (s *NodeState) Labels() map[string]string { return s.Info.Labels }

// Accepts reports whether a new pod with constraints p, asking for GPUs of
// models (none: any), may be scheduled on the node: as kube-scheduler's
// filters would judge it (its cordon and taints, the pod's node selector
// and required node affinity: Admits) and by api.ModelAllowed.
func (s *NodeState) Accepts(p eligible.Pod, models []string) bool {
	return s.Admits(p) && api.ModelAllowed(s.Info.Model, models)
}

// Admits reports whether a pod with constraints p may be scheduled on the
// node by its cordon, taints and labels (package eligible).
func (s *NodeState) Admits(p eligible.Pod) bool { return s.Info.Admits(p) }

// Refusal says why a pod with constraints p may not be scheduled on the
// node ("" when it may).
func (s *NodeState) Refusal(p eligible.Pod) string { return s.Info.Refusal(p) }

// FreeCPUMem is the allocatable CPU and memory the pods counted on the node
// do not request.
func (s *NodeState) FreeCPUMem() (cpuMilli, memMiB int64) {
	return max(0, s.Info.CPUMilli-s.CPUUsed), max(0, s.Info.MemMiB-s.MemUsed)
}

// Usable reports whether the node's inventory was read and is well formed.
func (s *NodeState) Usable() bool { return s.Info.HasInventory && s.Info.Err == nil }

// GPUCount is the number of GPUs of the inventory.
func (s *NodeState) GPUCount() int { return len(s.Info.GPUs) }

// GPURef names the GPU at position pos of the inventory.
func (s *NodeState) GPURef(pos int) api.GPURef {
	g := s.Info.GPUs[pos]
	return api.GPURef{UUID: g.UUID, Index: g.Index}
}

// Healthy reports whether the GPU at position pos is healthy.
func (s *NodeState) Healthy(pos int) bool { return s.Info.GPUs[pos].Healthy }

// Cliques are the node's NVLink cliques (inventory positions).
func (s *NodeState) Cliques() [][]int { return s.Info.Cliques }

// PendingWholeGPUs is PendingWhole.
func (s *NodeState) PendingWholeGPUs() int { return s.PendingWhole }

// NamesWholeGPUs is namesWholeGPUs (decide.go).
func (s *NodeState) NamesWholeGPUs(d planner.Demand) bool { return s.namesWholeGPUs(d.(*Demand)) }

// GPUPods are the pods using the GPU at position pos.
func (s *NodeState) GPUPods(pos int) []types.UID { return s.GPUs[pos].Pods }

// Occupants are the pods counted on the node with the GPUs each keeps
// from a reservation: its whole GPUs (named or pending), 1 for slices, 0
// for a pod of CPU only.
func (s *NodeState) Occupants() map[types.UID]int {
	out := make(map[types.UID]int, len(s.Pods))
	for uid, u := range s.Pods {
		gpus := u.WholeGPUs()
		if gpus == 0 && len(u.Shared)+len(u.PlannedShares) > 0 {
			gpus = 1
		}
		out[uid] = gpus
	}
	return out
}

// Without is the node without the pods gone (itself when it counts none
// of them).
func (s *NodeState) Without(gone map[types.UID]bool) planner.Node { return s.without(gone) }

// Empty is the node with no pod.
func (s *NodeState) Empty() planner.Node { return BuildNodeState(s.Info, nil) }

// Plannable reports whether gang planning may use the node: a well formed
// inventory, with shared isolation when shared.
func (s *NodeState) Plannable(shared bool) bool {
	return s.Info.Err == nil && (!shared || s.Info.SharedIsolation)
}

// Units are the node's memory unit and core-only slice base; ok is false
// without an inventory.
func (s *NodeState) Units() (unitMiB, sliceBaseMiB int64, ok bool) {
	return s.Info.UnitMiB, s.Info.SliceBaseMiB, s.Info.HasInventory
}

// GangNode is the node as gang planning sees it for members asking
// demands of GPU kind kind: its view, labels, NVLink cliques (GPU
// indices) and NUMA and MIG rules (gang.Node.Admit); false while a
// pending NVLink pod's clique is not known (see Check).
func (s *NodeState) GangNode(kind allocator.Kind, demands []planner.Demand) (gang.Node, bool) {
	if s.PendingNVLink > 0 {
		return gang.Node{}, false
	}
	info := s.Info
	cliques := make([][]int, 0, len(info.Cliques))
	for _, c := range info.Cliques {
		idx := make([]int, 0, len(c))
		for _, pos := range c {
			idx = append(idx, info.GPUs[pos].Index)
		}
		cliques = append(cliques, idx)
	}
	ds := demandsOf(demands)
	return gang.Node{Node: s.View(kind), Labels: info.Labels, Cliques: cliques, Admit: allOf(s.numaAdmit(ds), s.migAdmit(ds), s.spreadAdmit(ds))}, true
}

// spreadAdmit admits a slice over several GPUs (api.AnnotationGPUCount)
// where its bind would place it (SliceGPUs): the allocator view holds
// its share of one GPU only. Such a slice is a pod planned alone (a gang
// member's slice spans one GPU: ParseDemand), so each is checked alone.
// Nil when no demand spans several GPUs.
func (s *NodeState) spreadAdmit(demands []Demand) func(members []int) bool {
	if !slices.ContainsFunc(demands, func(d Demand) bool { return d.Kind() == allocator.Shared && d.gpus() > 1 }) {
		return nil
	}
	return func(members []int) bool {
		for _, m := range members {
			if d := &demands[m]; d.Kind() == allocator.Shared && d.gpus() > 1 {
				if _, err := s.SliceGPUs(d); err != nil {
					return false
				}
			}
		}
		return true
	}
}

// SliceGPUs names the GPUs of the node that the bind of a pod asking d,
// a slice over several GPUs, puts it on (ChoosePlacement), in index
// order: a plan names them all (api.GangPlan.GPU and Spread), so that the
// room it holds is the room bound. An error wrapping ErrNoFit says why it
// does not fit the node.
func (s *NodeState) SliceGPUs(d planner.Demand) ([]api.GPURef, error) {
	dd := d.(*Demand)
	if dd.Kind() != allocator.Shared || dd.gpus() < 2 {
		return nil, fmt.Errorf("%w: not a slice over several GPUs", ErrNoFit)
	}
	if v := Filter(s, dd); !v.Fits() {
		return nil, fmt.Errorf("%w: %s", ErrNoFit, v.Message)
	}
	pos, err := s.spreadGPUs(dd)
	if err != nil {
		return nil, err
	}
	out := make([]api.GPURef, len(pos))
	for i, p := range pos {
		out[i] = s.GPURef(p)
	}
	slices.SortFunc(out, func(a, b api.GPURef) int { return a.Index - b.Index })
	return out, nil
}

// AlignsAnywhere is alignsAnywhere (numa.go).
func (s *NodeState) AlignsAnywhere(d planner.Demand) bool { return s.alignsAnywhere(d.(*Demand)) }

// Whole is WholeGPUs.
func (d *Demand) Whole() int { return d.WholeGPUs }

// AsksMIG reports whether d asks for MIG instances.
func (d *Demand) AsksMIG() bool { return len(d.MIG) > 0 }

// NeedsNVLink is NVLink.
func (d *Demand) NeedsNVLink() bool { return d.NVLink }

// GPUModels is Models.
func (d *Demand) GPUModels() []string { return d.Models }

// SpansGPUs is the number of GPUs d's slice spans (api.AnnotationGPUCount;
// 1 for a slice of one GPU), 0 without a slice.
func (d *Demand) SpansGPUs() int {
	if d.Kind() != allocator.Shared {
		return 0
	}
	return d.gpus()
}
