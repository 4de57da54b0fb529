package extender

import (
	"fmt"
	"slices"
	"sort"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/allocator"
	"github.com/tessera-gpu/tessera/allocator/numa"
	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/gpureq"
	"github.com/tessera-gpu/tessera/internal/eligible"
)

// GPUInfo is one GPU of a node as its inventory describes it.
type GPUInfo struct {
	UUID  string
	Index int
	Model string
	// MemMiB is the memory the GPU shares out (gpureq.GPUCapacity): the
	// memory units the node agent advertises times the unit size.
	MemMiB  int64
	Healthy bool
	Reason  string
	// WithheldWhole and WithheldShared: the node agent still withholds the
	// GPU's whole device, or its memory and core units, from the kubelet
	// (the inventory's withheldFromWhole and withheldFromShared). The
	// extender's ledger frees a GPU when its pod ends; the node offers it
	// to the other kind only once the kubelet's allocations show it free.
	// Until then a pod of that kind is not bound to use it (NodeState.Offers,
	// Server.waitOffered), or the kubelet would refuse it.
	WithheldWhole  bool
	WithheldShared bool
	// NUMANode is the GPU's NUMA node, -1 when the platform reports none.
	NUMANode int
	// InMIG: the GPU is in MIG mode, offered only as its MIG instances
	// (NodeInfo.MIG), never whole or as slices.
	InMIG bool
}

// NodeInfo is the static part of a node: its GPUs (from the inventory
// annotation) and allocatable CPU and memory.
type NodeInfo struct {
	Name string
	// Err is set when the node's inventory annotation is malformed; such a
	// node fits no GPU pod.
	Err error
	// HasInventory is false for a node without the annotation (no GPUs).
	HasInventory bool
	UnitMiB      int64
	// SliceBaseMiB is the GPU memory a core-only slice takes its
	// percentage of (gpureq.CoreOnlyBaseMiB of the GPUs' MemMiB).
	SliceBaseMiB    int64
	SharedIsolation bool
	GPUs            []GPUInfo
	// Cliques are the NVLink cliques as positions in GPUs.
	Cliques [][]int
	// Model is the model of the node's GPUs (the first GPU's).
	Model    string
	CPUMilli int64
	MemMiB   int64
	// Labels are the node's labels (topology levels of gang planning).
	Labels map[string]string
	// PreferNoSchedule are the node's taints of that effect: the
	// shortlist leaves the choice among its best nodes to kube-scheduler
	// when one of them has such a taint the pod does not tolerate.
	PreferNoSchedule []corev1.Taint
	// eligibility is the node as package eligible reads it (name,
	// labels, NoSchedule and NoExecute taints, cordon): Admits.
	eligibility *corev1.Node
	// NUMA is the node's NUMA report (api.AnnotationNUMATopology); nil
	// when the node publishes none or the extender ignores it. NUMAErr is
	// a malformed report: the node then fits no GPU pod.
	NUMA    *NodeNUMA
	NUMAErr error
	// MIG are the MIG instances of the node's GPUs in MIG mode.
	MIG []MIGInstance
}

// position returns the position in GPUs of the GPU with uuid, or -1.
func (n *NodeInfo) position(uuid string) int {
	for i := range n.GPUs {
		if n.GPUs[i].UUID == uuid {
			return i
		}
	}
	return -1
}

// healthy counts the healthy GPUs offered whole (not in MIG mode).
func (n *NodeInfo) healthy() int {
	c := 0
	for i := range n.GPUs {
		if n.GPUs[i].Healthy && !n.GPUs[i].InMIG {
			c++
		}
	}
	return c
}

// inMIG counts the GPUs in MIG mode, offered as MIG instances only.
func (n *NodeInfo) inMIG() int {
	c := 0
	for i := range n.GPUs {
		if n.GPUs[i].InMIG {
			c++
		}
	}
	return c
}

// maxHealthyMemMiB is the largest memory a healthy GPU shares (not in MIG
// mode).
func (n *NodeInfo) maxHealthyMemMiB() int64 {
	var m int64
	for i := range n.GPUs {
		if n.GPUs[i].Healthy && !n.GPUs[i].InMIG {
			m = max(m, n.GPUs[i].MemMiB)
		}
	}
	return m
}

// NewNodeInfo reads a Node: its inventory annotation and allocatable CPU
// and memory. A malformed annotation is recorded in Err, not returned.
func NewNodeInfo(node *corev1.Node) *NodeInfo {
	info := &NodeInfo{Name: node.Name, Labels: node.Labels}
	info.eligibility = eligible.Node(node.Name, node.Labels, node.Spec.Taints, node.Spec.Unschedulable)
	for _, t := range node.Spec.Taints {
		if t.Effect == corev1.TaintEffectPreferNoSchedule {
			info.PreferNoSchedule = append(info.PreferNoSchedule, t)
		}
	}
	if q, ok := node.Status.Allocatable[corev1.ResourceCPU]; ok {
		info.CPUMilli = q.MilliValue()
	}
	if q, ok := node.Status.Allocatable[corev1.ResourceMemory]; ok {
		info.MemMiB = q.Value() >> 20
	}
	inv, ok, err := api.GetGPUInventory(node.Annotations)
	if err != nil {
		info.Err = err
		return info
	}
	if !ok {
		return info
	}
	if len(inv.GPUs) > allocator.MaxGPUsPerNode {
		info.Err = fmt.Errorf("annotation %s: %d GPUs, at most %d supported", api.AnnotationGPUInventory, len(inv.GPUs), allocator.MaxGPUsPerNode)
		return info
	}
	info.HasInventory = true
	info.UnitMiB = int64(inv.MemoryUnitMiB)
	info.SharedIsolation = inv.SharedIsolation
	pos := map[int]int{}
	withheldWhole, withheldShared := map[string]bool{}, map[string]bool{}
	for _, u := range inv.WithheldFromWhole {
		withheldWhole[u] = true
	}
	for _, u := range inv.WithheldFromShared {
		withheldShared[u] = true
	}
	for i, g := range inv.GPUs {
		info.GPUs = append(info.GPUs, GPUInfo{
			UUID: g.UUID, Index: g.Index, Model: g.Model,
			MemMiB:  int64(g.MemoryUnits) * int64(inv.MemoryUnitMiB),
			Healthy: g.Healthy, Reason: g.Reason,
			WithheldWhole: withheldWhole[g.UUID], WithheldShared: withheldShared[g.UUID],
			NUMANode: g.NUMANode, InMIG: g.MIG != nil,
		})
		pos[g.Index] = i
	}
	caps := make([]int64, len(info.GPUs))
	for i := range info.GPUs {
		caps[i] = info.GPUs[i].MemMiB
	}
	info.SliceBaseMiB = gpureq.CoreOnlyBaseMiB(caps...)
	if len(info.GPUs) > 0 {
		info.Model = info.GPUs[0].Model
	}
	for _, c := range inv.NVLinkCliques {
		pc := make([]int, 0, len(c))
		for _, idx := range c {
			pc = append(pc, pos[idx])
		}
		info.Cliques = append(info.Cliques, pc)
	}
	info.NUMA, info.NUMAErr = newNodeNUMA(node, info.GPUs)
	info.MIG = migInstances(inv.GPUs)
	return info
}

// SharedUse is one container's slice of a GPU.
type SharedUse struct {
	Container string
	// Kind says whether the container runs beside the pod's others
	// (gpureq.PeakAmount); PodUse.Shared lists them in the order the
	// containers start (gpureq.StartIndex).
	Kind   gpureq.Kind
	UUID   string
	Index  int
	MemMiB int64
	Cores  int64
}

// PodUse is what one pod uses on its node.
type PodUse struct {
	UID       types.UID
	Namespace string
	Name      string
	Node      string
	Priority  int32
	CPUMilli  int64
	MemMiB    int64
	Shared    []SharedUse
	// Whole are the UUIDs of the whole GPUs the node agent recorded.
	Whole []string
	// WholePending is the number of whole GPUs not recorded yet: counted
	// as "that many GPUs of the node" until the node agent names them.
	WholePending int
	// NVLink is set when the pending whole GPUs must be in one NVLink
	// clique.
	NVLink bool
	// Err is a malformed assignment annotation (the pod's GPU use is then
	// counted as pending whole GPUs only).
	Err error
	// Planned marks a gang member not bound yet, counted on the node of its
	// gang plan (api.AnnotationGangPlan).
	Planned bool
	// PlannedShares are the shared slices of a planned member, each on
	// every GPU of PlannedGPUs (one, or a multi-GPU slice's all); they are
	// sized against the node's inventory when the node state is built.
	PlannedShares []ContainerShare
	PlannedGPUs   []string
	// PlannedWhole are the GPUs a planned whole-GPU member's plan names
	// (api.GangPlan.GPUs): held for it alone until it binds, while pods
	// evicted for it may still be leaving them. A plan without them holds
	// WholePending GPUs of the node instead.
	PlannedWhole []string
	// Align is what the pod must find on one NUMA node where the node's
	// topology manager requires it (Demand.Align).
	Align numa.Demand
	// MIG are the UUIDs of the MIG instances the node agent recorded;
	// MIGPending counts, per profile, the instances not recorded yet
	// (the kubelet picks them).
	MIG        []string
	MIGPending map[string]int
	// Leaving marks a pod being deleted (its deletion timestamp is set):
	// it still holds what it uses until its node has stopped it.
	Leaving bool
}

// Key is namespace/name.
func (u *PodUse) Key() string { return u.Namespace + "/" + u.Name }

// WholeGPUs is the number of whole GPUs u holds: recorded, named by its
// plan, or pending.
func (u *PodUse) WholeGPUs() int { return len(u.Whole) + len(u.PlannedWhole) + u.WholePending }

// HoldsGPUs reports whether u holds any GPU room of its node: whole GPUs,
// shared slices (placed or planned) or MIG instances (recorded or
// pending). It is the one rule of "uses a GPU" for choosing victims: a pod
// that holds none was chosen by kube-scheduler for CPU or memory alone.
func (u *PodUse) HoldsGPUs() bool {
	return u.WholeGPUs() > 0 || len(u.Shared) > 0 || len(u.PlannedShares) > 0 || len(u.MIG) > 0 || len(u.MIGPending) > 0
}

// NewPodUse reads what a pod bound to a node uses from its requests and
// its assignment annotation. Pods that use nothing of interest still
// count their CPU and memory.
func NewPodUse(pod *corev1.Pod) *PodUse {
	u := &PodUse{UID: pod.UID, Namespace: pod.Namespace, Name: pod.Name, Node: pod.Spec.NodeName, Leaving: pod.DeletionTimestamp != nil}
	if pod.Spec.Priority != nil {
		u.Priority = *pod.Spec.Priority
	}
	d, err := ParseDemand(pod)
	if err != nil {
		// Count what can be counted without the GPU part.
		u.Err = err
	}
	u.CPUMilli, u.MemMiB, u.Align = d.CPUMilli, d.MemMiB, d.Align
	a, ok, aerr := api.GetAssignment(pod.Annotations)
	if aerr != nil {
		u.Err = aerr
		u.WholePending, u.MIGPending = d.unrecorded(nil) // its slice is somewhere: hold its GPUs
		return u
	}
	if ok {
		// Each GPU and instance once: an init container's are named for
		// it and for the container the kubelet handed them on to.
		whole, mig := gpureq.Recorded(a)
		for _, g := range whole {
			u.Whole = append(u.Whole, g.UUID)
		}
		for _, m := range mig {
			u.MIG = append(u.MIG, m.UUID)
		}
		// A multi-GPU slice holds its amount on each of its GPUs; in the
		// order the containers start, which gpureq.PeakAmount takes them in.
		for _, s := range gpureq.AssignedSlices(pod, a) {
			u.Shared = append(u.Shared, SharedUse{Container: s.Container, Kind: s.Kind, UUID: s.GPU.UUID, Index: s.GPU.Index, MemMiB: s.Amount.MemMiB, Cores: s.Amount.Cores})
		}
	}
	// A bound shared pod without a recorded slice (bound without the
	// extender, e.g. created with spec.nodeName) holds as many GPUs of the
	// node as its slice spans, like a pending whole-GPU pod.
	u.WholePending, u.MIGPending = d.unrecorded(a)
	u.NVLink = d.NVLink && d.WholeGPUs > 0 && u.WholePending > 0
	return u
}

// PlannedPodUse is what an unbound gang member holds on the node of its
// plan: its CPU and memory, its whole GPUs (pending: the node's device
// plugin picks them) or its shared slices on the planned GPU (a shared
// member planned without a GPU holds one GPU of the node, N for a slice of
// N GPUs).
func PlannedPodUse(pod *corev1.Pod, plan *api.GangPlan) *PodUse {
	u := &PodUse{UID: pod.UID, Namespace: pod.Namespace, Name: pod.Name, Node: plan.Node, Planned: true}
	if pod.Spec.Priority != nil {
		u.Priority = *pod.Spec.Priority
	}
	d, err := ParseDemand(pod)
	if err != nil {
		u.Err = err
	}
	u.CPUMilli, u.MemMiB, u.Align = d.CPUMilli, d.MemMiB, d.Align
	_, u.MIGPending = d.unrecorded(nil)
	switch d.Kind() {
	case allocator.Whole:
		u.NVLink = d.NVLink
		if len(plan.GPUs) != d.WholeGPUs {
			u.WholePending = d.WholeGPUs
			break
		}
		for _, g := range plan.GPUs {
			u.PlannedWhole = append(u.PlannedWhole, g.UUID)
		}
	case allocator.Shared:
		gpus := plan.SliceGPUs()
		if len(gpus) != d.gpus() {
			// Its slice's GPUs, wherever they go: a plan that names none,
			// or not all of them (one written when plans named one GPU
			// for any slice), holds them by count, and the bind places
			// the slice (plannedSliceGPUs).
			u.WholePending = d.gpus()
			break
		}
		u.PlannedShares = d.Shares
		for _, g := range gpus {
			u.PlannedGPUs = append(u.PlannedGPUs, g.UUID)
		}
	}
	return u
}

// plannedSliceGPUs are the GPUs a plan names for the slice of demand d,
// in index order: all of the GPUs it spans, or nil when the plan names
// none or not all of them (then it holds them by count: PlannedPodUse,
// and the bind chooses them).
func plannedSliceGPUs(plan *api.GangPlan, d *Demand) []api.GPURef {
	if plan == nil || d.Kind() != allocator.Shared {
		return nil
	}
	if gpus := plan.SliceGPUs(); len(gpus) == d.gpus() {
		return gpus
	}
	return nil
}

// sharedOn returns u's shared slices on a node described by info: its
// recorded slices, or for a planned member its planned slices sized with
// the node's memory unit.
func (u *PodUse) sharedOn(info *NodeInfo) []SharedUse {
	if len(u.PlannedShares) == 0 {
		return u.Shared
	}
	if !u.plannedGPUsIn(info) {
		return nil
	}
	out := make([]SharedUse, 0, len(u.PlannedShares)*len(u.PlannedGPUs))
	for _, sh := range u.PlannedShares {
		a := gpureq.Resolve(sh, info.UnitMiB, info.SliceBaseMiB)
		for _, uuid := range u.PlannedGPUs {
			out = append(out, SharedUse{Container: sh.Name, Kind: sh.Kind, UUID: uuid, Index: info.GPUs[info.position(uuid)].Index, MemMiB: a.MemMiB, Cores: a.Cores})
		}
	}
	return out
}

// plannedGPUsIn reports whether every GPU of a planned member's slice
// (PlannedGPUs) is in the inventory info.
func (u *PodUse) plannedGPUsIn(info *NodeInfo) bool {
	for _, uuid := range u.PlannedGPUs {
		if info.position(uuid) < 0 {
			return false
		}
	}
	return len(u.PlannedGPUs) > 0
}

// GPUState is the use of one GPU.
type GPUState struct {
	MemUsedMiB int64
	CoresUsed  int64
	// Whole counts the pods holding the GPU whole (more than one means
	// over-commitment reported by the node).
	Whole int
	// Held counts the planned whole-GPU members whose plans name the GPU
	// (PodUse.PlannedWhole): nothing else may be placed on it.
	Held int
	// Pods are the UIDs of the pods using the GPU.
	Pods []types.UID
}

// NodeState is an immutable snapshot of one node: what it has and what is
// used. The cache replaces it on every change; readers never see it
// change.
type NodeState struct {
	Info *NodeInfo
	GPUs []GPUState
	// PendingWhole is the number of whole GPUs held by pods whose GPUs the
	// node agent has not recorded yet.
	PendingWhole int
	// PendingNVLink counts the pending whole-GPU pods that need one NVLink
	// clique.
	PendingNVLink int
	// draining is set when planned whole-GPU pods held by count (a
	// reservation, a plan that names no GPUs) wait for more GPUs than are
	// free: the node is kept for them, and no new slice starts there, not
	// even beside the slices still running (it would keep a GPU from
	// emptying).
	draining bool
	CPUUsed  int64
	MemUsed  int64
	// Pods are the pods counted on the node, by UID.
	Pods map[types.UID]*PodUse
	// view is the allocator view for whole-GPU and CPU-only pods:
	// unhealthy and used GPUs have nothing free, and PendingWhole fully
	// free GPUs are held back.
	view allocator.Node
	// sharedView is the view for shared slices. While PendingWhole > 0 it
	// holds back every fully free GPU: the node agent has not said which
	// GPUs the pending pods got, and a slice put on a free GPU could be put
	// on one of them (the count rule, "enough free GPUs remain", cannot
	// know which). Slices still go to GPUs already in use.
	sharedView allocator.Node
	// offeredSharedView is sharedView without the GPUs the node still
	// withholds from shared use: where a new slice goes when it can
	// (ChoosePlacement), so that its bind need not wait (Offers).
	offeredSharedView allocator.Node
	// numa is the free room of the node's NUMA nodes (nil without a NUMA
	// report).
	numa *numaState
	// mig counts the node's MIG instances and their use (nil without
	// any).
	mig *migState
	// groups are the MPS groups of the GPUs serving slices
	// (gpureq.Groups: the GPUs of each container's slice); sets is set
	// when one spans several GPUs (a slice of one GPU cannot go there).
	groups gpureq.Groups
	sets   bool
	// memo caches Check and Score results of this state (see Query): a
	// ring of the last maxMemo demands, inline to spare a pointer chase.
	memoMu   sync.Mutex
	memo     [maxMemo]memoEntry
	memoNext int
}

// maxMemo bounds the results memoised per node state.
const maxMemo = 8

// memoEntry is what is known of one demand on a node state.
type memoEntry struct {
	// hash is demand's hash (Query.hash): compared first, since demands
	// are long strings that often share their length and a prefix.
	hash   uint64
	demand string // "": unused
	reason Reason
	policy allocator.Policy // nil: not scored yet
	score  float64
}

// recall returns the memo entry of demand.
func (s *NodeState) recall(hash uint64, demand string) (memoEntry, bool) {
	s.memoMu.Lock()
	defer s.memoMu.Unlock()
	for i := range s.memo {
		if s.memo[i].hash == hash && s.memo[i].demand == demand {
			return s.memo[i], true
		}
	}
	return memoEntry{}, false
}

// remember stores e, replacing the entry of the same demand or else the
// oldest.
func (s *NodeState) remember(e memoEntry) {
	s.memoMu.Lock()
	defer s.memoMu.Unlock()
	for i := range s.memo {
		if s.memo[i].hash == e.hash && s.memo[i].demand == e.demand {
			s.memo[i] = e
			return
		}
	}
	s.memo[s.memoNext] = e
	s.memoNext = (s.memoNext + 1) % maxMemo
}

// rawFree reports whether the GPU at position p is healthy and unused,
// pending whole-GPU pods aside.
func (s *NodeState) rawFree(p int) bool {
	g := s.GPUs[p]
	return s.Info.GPUs[p].Healthy && !s.Info.GPUs[p].InMIG && g.Whole == 0 && g.Held == 0 && g.MemUsedMiB == 0 && g.CoresUsed == 0
}

// offeredWhole reports whether the GPU at position p is free (rawFree) and
// the node offers it whole now (gpureq.CheckWhole: a GPU the node still
// withholds from whole use counts as shared).
func (s *NodeState) offeredWhole(p int) bool {
	return s.rawFree(p) && gpureq.CheckWhole(gpureq.GPUUse{Shared: s.Info.GPUs[p].WithheldWhole}) == nil
}

// Offers reports whether the node offers now what u, a use counted in s,
// needs from its kubelet, and if not, why: every GPU of u's slices not
// withheld from shared use, and for whole GPUs the kubelet is still to
// choose, as many free GPUs offered whole as pending whole GPUs are
// counted on the node (u's among them), in one NVLink clique for u when it
// needs one; for slices, the node's shared isolation connected. The ledger frees a GPU when its pod ends, but the node agent
// offers it to the other kind only once the kubelet's allocations show it
// free (the inventory's withheld lists); a pod bound before would be
// refused by the kubelet. Filter does not ask this (the scheduler would
// not retry the pod when the node releases the GPU); Bind waits for it.
func (s *NodeState) Offers(u *PodUse) (bool, string) {
	info := s.Info
	shared := u.sharedOn(info)
	if len(shared) > 0 && !info.SharedIsolation {
		// The node's NRI plugin is away (the runtime or the agent
		// restarts): its device plugin refuses shared units until it is
		// back.
		return false, "the node's shared-GPU isolation (its NRI plugin) is not connected"
	}
	for _, sh := range shared {
		if p := info.position(sh.UUID); p >= 0 && gpureq.CheckShared(gpureq.GPUUse{Whole: info.GPUs[p].WithheldShared}) != nil {
			return false, fmt.Sprintf("GPU %d is still withheld from shared use (its whole-GPU pod ended; the kubelet has not freed it yet)", info.GPUs[p].Index)
		}
	}
	if u.WholePending == 0 {
		return true, ""
	}
	offered := 0
	for p := range info.GPUs {
		if s.offeredWhole(p) {
			offered++
		}
	}
	if offered < s.PendingWhole {
		return false, fmt.Sprintf("%d free GPUs are offered whole, %d pending whole GPUs need them (GPUs whose slices ended are still withheld from whole use until the kubelet frees them)", offered, s.PendingWhole)
	}
	if u.NVLink && u.WholePending > 1 && largestClique(info, s.offeredWhole) < u.WholePending {
		return false, fmt.Sprintf("no NVLink clique has %d free GPUs offered whole", u.WholePending)
	}
	return true, ""
}

// View returns a copy of the allocator view of the node for pods of
// kind.
func (s *NodeState) View(kind allocator.Kind) *allocator.Node { return s.viewFor(kind).Clone() }

// viewForDemand is the view d is fitted and scored on: viewFor its kind,
// and for a slice of one GPU without the GPUs of multi-GPU sets
// (singleSliceView). A multi-GPU slice is scored as its share of one GPU.
func (s *NodeState) viewForDemand(d *Demand) *allocator.Node {
	kind := d.Kind()
	if kind == allocator.Shared && d.gpus() == 1 {
		return s.singleSliceView(s.viewFor(kind))
	}
	return s.viewFor(kind)
}

func (s *NodeState) viewFor(kind allocator.Kind) *allocator.Node {
	if kind == allocator.Shared {
		return &s.sharedView
	}
	return &s.view
}

// FreeGPUs is the number of completely free GPUs available to new pods
// (fully free GPUs minus those held for pending whole-GPU pods).
func (s *NodeState) FreeGPUs() int { return s.view.FullyFreeGPUs() }

// BuildNodeState accounts uses (pods and reservations) on a node.
func BuildNodeState(info *NodeInfo, uses []*PodUse) *NodeState {
	s := &NodeState{Info: info, GPUs: make([]GPUState, len(info.GPUs)), Pods: make(map[types.UID]*PodUse, len(uses))}
	sort.Slice(uses, func(i, j int) bool { return uses[i].UID < uses[j].UID })
	plannedPending := 0
	for _, u := range uses {
		s.Pods[u.UID] = u
		if u.Planned {
			plannedPending += u.WholePending
		}
		s.CPUUsed += u.CPUMilli
		s.MemUsed += u.MemMiB
		s.PendingWhole += u.WholePending
		if u.WholePending > 0 && u.NVLink {
			s.PendingNVLink++
		}
		for _, uuid := range u.Whole {
			if p := info.position(uuid); p >= 0 {
				s.GPUs[p].Whole++
				s.GPUs[p].Pods = append(s.GPUs[p].Pods, u.UID)
			} else {
				// The GPU left the inventory: keep counting the pod.
				s.PendingWhole++
			}
		}
		for _, uuid := range u.PlannedWhole {
			if p := info.position(uuid); p >= 0 && info.GPUs[p].Healthy && !info.GPUs[p].InMIG {
				s.GPUs[p].Held++
				s.GPUs[p].Pods = append(s.GPUs[p].Pods, u.UID)
			} else {
				// The planned GPU left the inventory or failed: hold
				// another GPU of the node.
				s.PendingWhole++
			}
		}
		if len(u.PlannedShares) > 0 && !u.plannedGPUsIn(info) {
			// A planned GPU left the inventory: hold as many GPUs of the
			// node as the slice spans.
			s.PendingWhole += max(1, len(u.PlannedGPUs))
		}
		shared := u.sharedOn(info)
		for _, uuids := range sliceGPUs(shared) {
			s.groups.Add(uuids)
			s.sets = s.sets || len(uuids) > 1
		}
		for p, a := range sharedPeaks(info, shared) {
			g := &s.GPUs[p]
			g.MemUsedMiB += a.MemMiB
			g.CoresUsed += a.Cores
			if len(g.Pods) == 0 || g.Pods[len(g.Pods)-1] != u.UID {
				g.Pods = append(g.Pods, u.UID)
			}
		}
	}
	if plannedPending > 0 {
		free := 0
		for p := range info.GPUs {
			if s.rawFree(p) {
				free++
			}
		}
		s.draining = s.PendingWhole > free
	}
	// Each view is built only where it differs from the one before it:
	// the ledger is rebuilt on every change of a node's pods.
	s.view = s.buildView(s.PendingWhole, false)
	s.sharedView = s.view
	hold := 0
	if s.PendingWhole > 0 {
		hold = len(info.GPUs)
		s.sharedView = s.buildView(hold, false)
	}
	s.offeredSharedView = s.sharedView
	if slices.ContainsFunc(info.GPUs, func(g GPUInfo) bool { return g.WithheldShared }) {
		s.offeredSharedView = s.buildView(hold, true)
	}
	if s.draining {
		// Every reader of the slice views (the filter, the bind, the
		// planner's gang nodes) sees no room for a slice.
		s.sharedView = closedView(s.sharedView)
		s.offeredSharedView = s.sharedView
	}
	s.buildNUMA()
	s.buildMIG()
	return s
}

// sliceGPUs are the GPUs of each container's slice among shared, in the
// order the containers first appear.
func sliceGPUs(shared []SharedUse) [][]string {
	var order []string
	by := map[string][]string{}
	for _, sh := range shared {
		if _, seen := by[sh.Container]; !seen {
			order = append(order, sh.Container)
		}
		by[sh.Container] = append(by[sh.Container], sh.UUID)
	}
	out := make([][]string, 0, len(order))
	for _, c := range order {
		out = append(out, by[c])
	}
	return out
}

// singleSliceView is v (a view for slices) where a slice of one GPU may
// go: without the GPUs under the MPS daemon of a multi-GPU set (the group
// rule, gpureq.Groups).
func (s *NodeState) singleSliceView(v *allocator.Node) *allocator.Node {
	if !s.sets {
		return v
	}
	out := v.Clone()
	for p := range out.GPUs {
		if p < len(s.Info.GPUs) && s.groups.InSet(s.Info.GPUs[p].UUID) {
			out.GPUs[p].MilliFree, out.GPUs[p].MemFreeMiB = 0, 0
		}
	}
	return out
}

// candidates describes the GPUs of view (a view for slices) for a
// multi-GPU slice of req on each (gpureq.ChooseGPUs).
func (s *NodeState) candidates(v *allocator.Node, req allocator.Request) []gpureq.Candidate {
	out := make([]gpureq.Candidate, len(s.Info.GPUs))
	for p, g := range s.Info.GPUs {
		c := gpureq.Candidate{UUID: g.UUID, Index: g.Index}
		if p < len(v.GPUs) {
			ag := v.GPUs[p]
			c.Room = ag.MilliFree >= req.GPUMilli && ag.MemFreeMiB >= req.GPUMemMiB
			c.FreeMiB = ag.MemFreeMiB
		}
		c.Group, _ = s.groups.Of(g.UUID)
		out[p] = c
	}
	return out
}

// sharedPeaks is what one pod's slices take of each GPU of the node (by
// position) at once: gpureq.PeakAmount of its slices on that GPU. Slices on
// GPUs not in the inventory are left out.
func sharedPeaks(info *NodeInfo, shared []SharedUse) map[int]gpureq.Amount {
	if len(shared) == 0 {
		return nil
	}
	held := map[int][]gpureq.Held{}
	var order []int
	for _, sh := range shared {
		p := info.position(sh.UUID)
		if p < 0 {
			continue
		}
		if _, seen := held[p]; !seen {
			order = append(order, p)
		}
		held[p] = append(held[p], gpureq.Held{Kind: sh.Kind, Amount: gpureq.Amount{MemMiB: sh.MemMiB, Cores: sh.Cores}})
	}
	out := make(map[int]gpureq.Amount, len(order))
	for _, p := range order {
		out[p] = gpureq.PeakAmount(held[p])
	}
	return out
}

// buildView builds an allocator view that holds back hold fully free
// GPUs (from the last position). With slicesOffered, a GPU the node still
// withholds from shared use has no room (gpureq.CheckShared: it counts as
// used whole).
func (s *NodeState) buildView(hold int, slicesOffered bool) allocator.Node {
	info := s.Info
	v := allocator.Node{
		Name:             info.Name,
		Model:            info.Model,
		CPUMilliCapacity: info.CPUMilli,
		MemMiBCapacity:   info.MemMiB,
	}
	v.CPUMilliFree, v.MemMiBFree = s.FreeCPUMem()
	if info.Err != nil {
		return v
	}
	v.GPUs = make([]allocator.GPU, len(info.GPUs))
	for i, g := range info.GPUs {
		st := s.GPUs[i]
		ag := allocator.GPU{Index: g.Index, MemTotalMiB: g.MemMiB}
		whole := st.Whole > 0 || st.Held > 0 || (slicesOffered && g.WithheldShared)
		if g.Healthy && !g.InMIG && gpureq.CheckShared(gpureq.GPUUse{Whole: whole}) == nil {
			ag.MilliFree = max(0, allocator.MilliPerGPU-gpureq.UsedCoresToMilli(st.CoresUsed))
			ag.MemFreeMiB = max(0, g.MemMiB-st.MemUsedMiB)
		}
		v.GPUs[i] = ag
	}
	for i := len(v.GPUs) - 1; i >= 0 && hold > 0; i-- {
		if v.GPUs[i].FullyFree() {
			v.GPUs[i].MilliFree, v.GPUs[i].MemFreeMiB = 0, 0
			hold--
		}
	}
	return v
}

// closedView is v with no GPU room left (CPU and memory as they are).
func closedView(v allocator.Node) allocator.Node {
	v.GPUs = slices.Clone(v.GPUs)
	for i := range v.GPUs {
		v.GPUs[i].MilliFree, v.GPUs[i].MemFreeMiB = 0, 0
	}
	return v
}

// without returns snap with the pods gone removed from their nodes'
// states (unchanged nodes are shared).
func without(snap map[string]*NodeState, gone map[types.UID]bool) map[string]*NodeState {
	if len(gone) == 0 {
		return snap
	}
	out := make(map[string]*NodeState, len(snap))
	for n, st := range snap {
		out[n] = st.without(gone)
	}
	return out
}

// without returns s with the pods gone removed (s itself when it counts
// none of them).
func (s *NodeState) without(gone map[types.UID]bool) *NodeState {
	if len(gone) == 0 {
		return s // the filter's common case: no reservation on the node
	}
	hit := false
	for uid := range s.Pods {
		if gone[uid] {
			hit = true
			break
		}
	}
	if !hit {
		return s
	}
	uses := make([]*PodUse, 0, len(s.Pods))
	for uid, u := range s.Pods {
		if !gone[uid] {
			uses = append(uses, u)
		}
	}
	return BuildNodeState(s.Info, uses)
}

// Admits reports whether a pod with constraints p may be scheduled on the
// node by its cordon, taints and labels (package eligible); Refusal says
// why not ("" when it may).
func (n *NodeInfo) Admits(p eligible.Pod) bool { return p.Allows(n.eligibility) }

func (n *NodeInfo) Refusal(p eligible.Pod) string { return p.Why(n.eligibility) }
