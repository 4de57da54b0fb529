package extender

import (
	"errors"
	"fmt"
	"slices"
	"sort"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/allocator"
	"github.com/tessera-gpu/tessera/allocator/numa"
	"github.com/tessera-gpu/tessera/api"
)

// NodeNUMA is a node's NUMA layout as its agent publishes it
// (api.AnnotationNUMATopology): the kubelet's topology manager policy and
// scope, and per NUMA node the exclusive-capable CPUs and who holds them.
type NodeNUMA struct {
	Policy numa.Policy
	Scope  numa.Scope
	// Static is set when the kubelet's CPU manager gives exclusive CPUs.
	Static bool
	Zones  []api.NUMAZone
	// Held maps the pods the node reports holding exclusive CPUs, by UID
	// or namespace/name (api.NUMAPodUse.Key), to what they hold.
	Held map[string][]api.NUMAZoneUse
	// AlignGPUs is false when a GPU of the node has no NUMA node: the
	// kubelet then gives no NUMA hint for GPUs, and only CPUs align.
	AlignGPUs bool
}

// newNodeNUMA reads a node's NUMA annotation; nil, nil when it has none.
func newNodeNUMA(node *corev1.Node, gpus []GPUInfo) (*NodeNUMA, error) {
	t, ok, err := api.GetNUMATopology(node.Annotations)
	if err != nil || !ok {
		return nil, err
	}
	n := &NodeNUMA{
		Policy: numa.Policy(t.TopologyManagerPolicy),
		Scope:  numa.Scope(t.TopologyManagerScope),
		Static: t.CPUManagerPolicy == api.CPUManagerPolicyStatic,
		Zones:  t.Zones,
		Held:   make(map[string][]api.NUMAZoneUse, len(t.Pods)),
	}
	for _, p := range t.Pods {
		n.Held[p.Key()] = p.Zones
	}
	n.AlignGPUs = true
	for _, g := range gpus {
		if g.NUMANode < 0 || t.Zone(g.NUMANode) == nil {
			n.AlignGPUs = false
		}
	}
	return n, nil
}

// numaState is what a node state knows of its NUMA nodes: the free room
// from the node's report, less what pods counted on the node hold there but
// the node has not reported yet (held units, placed by the search).
type numaState struct {
	// zones are the zones with their free CPUs and memory; GPUs are filled
	// per check (they depend on the ledger's views).
	zones []numa.Zone
	held  []numa.Held
}

// heldOf returns the node's reported use of pod u (nil when none).
func (n *NodeNUMA) heldOf(u *PodUse) []api.NUMAZoneUse {
	if h, ok := n.Held[string(u.UID)]; ok {
		return h
	}
	if h, ok := n.Held[u.Namespace+"/"+u.Name]; ok {
		return h
	}
	return nil
}

// needs is the units of d to align on this node: CPUs only with the static
// CPU manager, GPUs only where every GPU has a NUMA node.
func (n *NodeNUMA) needs(d numa.Demand) []numa.Need {
	out := d.Needs(n.Scope)
	trackMem := slices.ContainsFunc(n.Zones, func(z api.NUMAZone) bool { return z.MemoryMiB > 0 })
	var keep []numa.Need
	for _, u := range out {
		if !n.Static {
			u.CPUs = 0
		}
		if !trackMem {
			u.MemMiB = 0
		}
		if !n.AlignGPUs {
			u.GPUs, u.Slice, u.MIG = 0, false, nil
		}
		if !u.IsZero() {
			keep = append(keep, u)
		}
	}
	return keep
}

// buildNUMA computes the node's NUMA state from the report and the pods
// counted on the node. A pod the report lists holds what the report says
// (a listed pod no longer counted here has ended: its CPUs are free again).
// A pod it does not list yet holds its units on some zone: on the zone of
// its recorded GPUs where the policy aligns them, else wherever the search
// finds room. Whole GPUs still pending are held the same way.
func (s *NodeState) buildNUMA() {
	info := s.Info
	n := info.NUMA
	if n == nil {
		return
	}
	st := &numaState{}
	usedCPUs, usedMem := map[int]int{}, map[int]int64{}
	uids := make([]string, 0, len(s.Pods))
	for uid := range s.Pods {
		uids = append(uids, string(uid))
	}
	sort.Strings(uids)
	for _, id := range uids {
		u := s.Pods[types.UID(id)]
		reported := n.heldOf(u)
		for _, z := range reported {
			usedCPUs[z.ID] += z.CPUs
			usedMem[z.ID] += z.MemoryMiB
		}
		zone := s.podZone(u, reported)
		if reported != nil {
			if u.WholePending > 0 && n.AlignGPUs {
				st.held = append(st.held, numa.Held{Need: numa.Need{GPUs: u.WholePending}, Zone: zone})
			}
			if len(u.MIGPending) > 0 && n.AlignGPUs {
				st.held = append(st.held, numa.Held{Need: numa.Need{MIG: u.MIGPending}, Zone: zone})
			}
			continue
		}
		for _, need := range n.needs(u.Align) {
			if len(u.Whole) > 0 || len(u.PlannedWhole) > 0 || len(u.sharedOn(info)) > 0 {
				// Its GPUs are counted on their GPUs already.
				need.GPUs, need.Slice = 0, false
			} else if need.GPUs > 0 && u.WholePending > 0 {
				need.GPUs = min(need.GPUs, u.WholePending)
			}
			if len(u.MIG) > 0 {
				need.MIG = nil // its instances are counted as used already
			}
			need.Slice = false // a slice not recorded holds a GPU (PendingWhole)
			if need.IsZero() {
				continue
			}
			st.held = append(st.held, numa.Held{Need: need, Zone: zone})
		}
		if u.WholePending > 0 && n.AlignGPUs && len(n.needs(u.Align)) == 0 {
			st.held = append(st.held, numa.Held{Need: numa.Need{GPUs: u.WholePending}, Zone: -1})
		}
	}
	for _, z := range n.Zones {
		nz := numa.Zone{ID: z.ID, CPUs: z.CPUs, FreeCPUs: max(0, z.CPUs-usedCPUs[z.ID]), MemMiB: z.MemoryMiB}
		if z.MemoryMiB > 0 {
			nz.FreeMemMiB = max(0, z.MemoryMiB-usedMem[z.ID])
		}
		st.zones = append(st.zones, nz)
	}
	s.numa = st
}

// podZone is the zone pod u is bound to where the policy aligns: the NUMA
// node of its recorded GPUs (or MIG instances), else of its reported CPUs,
// when that is a single one; -1 otherwise.
func (s *NodeState) podZone(u *PodUse, reported []api.NUMAZoneUse) int {
	info := s.Info
	zones := map[int]bool{}
	if info.NUMA.AlignGPUs {
		for _, uuid := range slices.Concat(u.Whole, u.PlannedWhole) {
			if p := info.position(uuid); p >= 0 {
				zones[info.GPUs[p].NUMANode] = true
			}
		}
		for _, uuid := range u.MIG {
			if in := info.migInstance(uuid); in != nil {
				zones[info.GPUs[in.GPU].NUMANode] = true
			}
		}
		for _, sh := range u.sharedOn(info) {
			if p := info.position(sh.UUID); p >= 0 {
				zones[info.GPUs[p].NUMANode] = true
			}
		}
	}
	if len(zones) == 0 {
		for _, z := range reported {
			if z.CPUs > 0 || z.MemoryMiB > 0 {
				zones[z.ID] = true
			}
		}
	}
	if len(zones) != 1 {
		return -1
	}
	for z := range zones {
		return z
	}
	return -1
}

// numaZones returns the zones with the GPU room for demand d of kind: free
// whole GPUs (healthy, unused), whether a GPU has room for d's slice, and
// the healthy MIG instances of each profile with those no recorded pod
// holds (instances not recorded yet are held units, buildNUMA).
func (s *NodeState) numaZones(d *Demand) []numa.Zone {
	info := s.Info
	zones := append([]numa.Zone(nil), s.numa.zones...)
	var req allocator.Request
	shared := d.Kind() == allocator.Shared
	if shared {
		req = d.Request(info.UnitMiB, info.SliceBaseMiB)
	}
	view := s.viewFor(allocator.Shared)
	for i := range zones {
		for p := range info.GPUs {
			if info.GPUs[p].NUMANode != zones[i].ID || !info.GPUs[p].Healthy {
				continue
			}
			zones[i].GPUs++
			if s.rawFree(p) {
				zones[i].FreeGPUs++
			}
			if shared && p < len(view.GPUs) && view.GPUs[p].MilliFree >= req.GPUMilli && view.GPUs[p].MemFreeMiB >= req.GPUMemMiB {
				zones[i].SliceRoom = true
			}
		}
		for _, in := range info.MIG {
			if !in.Healthy || info.GPUs[in.GPU].NUMANode != zones[i].ID {
				continue
			}
			if zones[i].MIG == nil {
				zones[i].MIG, zones[i].FreeMIG = map[string]int{}, map[string]int{}
			}
			zones[i].MIG[in.Profile]++
			if !s.mig.holds(in.UUID) {
				zones[i].FreeMIG[in.Profile]++
			}
		}
	}
	return zones
}

// requiredNUMA is the node's NUMA report when its topology manager requires
// alignment (and the node's NUMA state is built); nil otherwise: the
// checks below then have nothing to enforce.
func (s *NodeState) requiredNUMA() *NodeNUMA {
	n := s.Info.NUMA
	if n == nil || s.numa == nil || !n.Policy.Requires() {
		return nil
	}
	return n
}

// checkNUMA applies the NUMA rule for demand d on the node: nil when the
// node's policy does not require alignment or d's units fit.
func (s *NodeState) checkNUMA(d *Demand) error {
	n := s.requiredNUMA()
	if n == nil {
		return nil
	}
	needs := n.needs(d.Align)
	if len(needs) == 0 {
		return nil
	}
	return numa.Check(n.Policy, s.numaZones(d), s.numa.held, needs)
}

// alignsAnywhere reports whether a pod asking d may be placed on the node
// without a NUMA check (planner.Node's AlignsAnywhere): the node's
// topology manager does not require alignment, or each of d's units that
// must meet on one NUMA node is a single GPU or slice and nothing else (a
// GPU lies on one NUMA node, so any free one will do). A unit of several
// GPUs, exclusive CPUs or pinned memory needs the zones' free GPUs and
// CPUs, which only the node's own check (checkNUMA) weighs.
func (s *NodeState) alignsAnywhere(d *Demand) bool {
	n := s.requiredNUMA()
	if n == nil {
		return true
	}
	for _, u := range n.needs(d.Align) {
		gpus := u.GPUs
		if u.Slice {
			gpus++
		}
		for _, c := range u.MIG {
			gpus += c // instances of several GPUs may lie on different NUMA nodes
		}
		if u.CPUs > 0 || u.MemMiB > 0 || gpus > 1 {
			return false
		}
	}
	return true
}

// numaAligned reports whether d's units can be aligned on the node now,
// for a node whose policy only prefers alignment (best-effort): such nodes
// score higher where they can.
func (s *NodeState) numaAligned(d *Demand) bool {
	n := s.Info.NUMA
	if n == nil || s.numa == nil || !n.Policy.Prefers() {
		return true
	}
	needs := n.needs(d.Align)
	if len(needs) == 0 {
		return true
	}
	_, ok := numa.Fit(s.numaZones(d), s.numa.held, needs)
	return ok
}

// numaSliceZone is the zone the pod's slice must go to on a node that
// requires alignment (-1: any GPU).
func (s *NodeState) numaSliceZone(d *Demand) int {
	n := s.requiredNUMA()
	if n == nil || d.Kind() != allocator.Shared {
		return -1
	}
	needs := n.needs(d.Align)
	placed, ok := numa.Fit(s.numaZones(d), s.numa.held, needs)
	if !ok {
		return -1
	}
	for i, u := range needs {
		if u.Slice {
			return placed[i]
		}
	}
	return -1
}

// numaReason maps a NUMA rule's error to a Reason.
func numaReason(err error) Reason {
	var ne *numa.Error
	if errors.As(err, &ne) && ne.TooLarge {
		return NUMANodeTooSmall
	}
	return NoNUMAFit
}

// explainNUMA is the filter message of a NUMA rejection.
func explainNUMA(st *NodeState, d *Demand) string {
	if st == nil {
		return "does not fit"
	}
	if st.Info.NUMAErr != nil {
		return fmt.Sprintf("node's %s annotation is malformed", api.AnnotationNUMATopology)
	}
	if err := st.checkNUMA(d); err != nil {
		return fmt.Sprintf("%v (topology manager policy %s)", err, st.Info.NUMA.Policy)
	}
	return "no NUMA node fits"
}

// inZone is view with no room on GPUs outside NUMA node zone (view itself
// when zone is -1).
func inZone(view *allocator.Node, info *NodeInfo, zone int) *allocator.Node {
	if zone < 0 {
		return view
	}
	v := view.Clone()
	for p := range v.GPUs {
		if p < len(info.GPUs) && info.GPUs[p].NUMANode != zone {
			v.GPUs[p].MilliFree, v.GPUs[p].MemFreeMiB = 0, 0
		}
	}
	return v
}

// numaAdmit is the gang planner's NUMA rule for the node (gang.Node.Admit):
// the members it would put on the node, demands[i] for member i, must find
// room together as the kubelet aligns them. nil where the node's policy
// does not require alignment.
func (s *NodeState) numaAdmit(demands []Demand) func(members []int) bool {
	if s.Info.NUMAErr != nil {
		return func([]int) bool { return false }
	}
	n := s.requiredNUMA()
	if n == nil {
		return nil
	}
	return func(members []int) bool {
		if len(members) == 0 {
			return true
		}
		var needs []numa.Need
		for _, m := range members {
			needs = append(needs, n.needs(demands[m].Align)...)
		}
		return numa.Check(n.Policy, s.numaZones(&demands[members[0]]), s.numa.held, needs) == nil
	}
}
