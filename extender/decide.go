package extender

import (
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"slices"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/allocator"
	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/gpureq"
)

// Reason says why a pod does not fit a node. It is a stable identifier,
// used as a metric label.
type Reason string

// Reasons a node is rejected.
const (
	Fits                 Reason = ""
	UnknownNode          Reason = "unknown-node"
	BadInventory         Reason = "malformed-inventory"
	NoGPUs               Reason = "no-gpus"
	ModelNotAllowed      Reason = "gpu-model-not-allowed"
	NoSharedIsolation    Reason = "shared-isolation-unavailable"
	InvalidRequest       Reason = "invalid-request"
	TooFewGPUs           Reason = "too-few-gpus"
	NoNVLinkClique       Reason = "nvlink-clique-too-small"
	GPUCountAboveNode    Reason = "gpu-count-above-node"
	SliceTooLarge        Reason = "slice-larger-than-any-gpu"
	InsufficientCPU      Reason = "insufficient-cpu"
	InsufficientMemory   Reason = "insufficient-memory"
	InsufficientGPUs     Reason = "insufficient-free-gpus"
	NoGPUForSlice        Reason = "no-gpu-for-slice"
	NoFreeNVLinkClique   Reason = "no-free-nvlink-clique"
	PendingNVLinkPod     Reason = "nvlink-pod-pending"
	BadNUMATopology      Reason = "malformed-numa-topology"
	NUMANodeTooSmall     Reason = "numa-node-too-small"
	NoNUMAFit            Reason = "no-numa-node-fits"
	NoMIG                Reason = "no-mig"
	NoMIGProfile         Reason = "mig-profile-missing"
	InsufficientMIG      Reason = "insufficient-free-mig"
	KeptForWholeGPUs     Reason = "kept-for-whole-gpus"
	reasonAllocatorOther Reason = "other"
)

// Unresolvable reports whether preempting pods on the node cannot help.
func (r Reason) Unresolvable() bool {
	switch r {
	case BadInventory, NoGPUs, ModelNotAllowed, NoSharedIsolation, InvalidRequest, TooFewGPUs, NoNVLinkClique, SliceTooLarge, GPUCountAboveNode,
		BadNUMATopology, NUMANodeTooSmall, NoMIG, NoMIGProfile:
		return true
	}
	return false
}

// Verdict is the filter's answer for one node.
type Verdict struct {
	Reason Reason
	// Message explains the reason. It depends on the pod's demand and the
	// node's GPU model only, so that kube-scheduler's summary ("3 nodes:
	// <message>") groups nodes rejected for the same reason.
	Message string
}

// Fits reports whether the pod fits.
func (v Verdict) Fits() bool { return v.Reason == Fits }

// Filter decides whether demand d fits node state st (nil: unknown node)
// and explains a rejection.
func Filter(st *NodeState, d *Demand) Verdict {
	r := Check(st, d)
	if r == Fits {
		return Verdict{}
	}
	return Verdict{Reason: r, Message: Explain(r, st, d)}
}

// Check decides whether demand d fits node state st (nil: unknown node).
// It does not allocate.
func Check(st *NodeState, d *Demand) Reason {
	if st == nil {
		return UnknownNode
	}
	kind := d.Kind()
	info := st.Info
	if !d.UsesGPUs() {
		return Fits
	}
	switch {
	case info.Err != nil:
		return BadInventory
	case !info.HasInventory || len(info.GPUs) == 0:
		return NoGPUs
	case !api.ModelAllowed(info.Model, d.Models):
		return ModelNotAllowed
	case len(d.MIG) > 0:
		if r, _ := st.checkMIG(d); r != Fits {
			return r
		}
		return st.checkAlignment(d)
	case kind == allocator.Shared && !info.SharedIsolation:
		return NoSharedIsolation
	}
	req := d.Request(info.UnitMiB, info.SliceBaseMiB)
	if req.Validate() != nil {
		return InvalidRequest
	}
	switch kind {
	case allocator.Whole:
		if info.healthy() < d.WholeGPUs {
			return TooFewGPUs
		}
		if d.NVLink && d.WholeGPUs > 1 && largestClique(info, func(p int) bool { return info.GPUs[p].Healthy }) < d.WholeGPUs {
			return NoNVLinkClique
		}
	case allocator.Shared:
		if gpureq.CheckCount(d.gpus(), info.healthy()) != nil {
			return GPUCountAboveNode
		}
		if req.GPUMemMiB > info.maxHealthyMemMiB() {
			return SliceTooLarge
		}
		if d.NVLink && d.gpus() > 1 && largestClique(info, func(p int) bool { return info.GPUs[p].Healthy && !info.GPUs[p].InMIG }) < d.gpus() {
			return NoNVLinkClique
		}
	}
	if kind == allocator.Shared && st.draining {
		return KeptForWholeGPUs
	}
	switch allocator.Fit(st.viewForDemand(d), req) {
	case allocator.Fits:
	case allocator.InsufficientCPU:
		return InsufficientCPU
	case allocator.InsufficientMemory:
		return InsufficientMemory
	case allocator.InsufficientWholeGPUs:
		return InsufficientGPUs
	case allocator.NoGPUForSlice:
		return NoGPUForSlice
	case allocator.ModelNotAllowed:
		return ModelNotAllowed
	case allocator.NoGPUs:
		return NoGPUs
	case allocator.InvalidRequest:
		return InvalidRequest
	default:
		return reasonAllocatorOther
	}
	if kind == allocator.Shared && d.gpus() > 1 {
		// Where the node aligns on NUMA nodes, all on the NUMA node of the
		// pod's units (as ChoosePlacement places them).
		if _, ok := st.chooseSliceGPUs(inZone(st.viewFor(allocator.Shared), info, st.numaSliceZone(d)), d); !ok {
			return NoGPUForSlice
		}
	}
	if kind == allocator.Whole {
		// Which GPUs pending whole-GPU pods get is the node's choice. An
		// NVLink pod still waiting for its GPUs needs a clique that another
		// whole-GPU pod must not break: wait until it is recorded. And a
		// new NVLink pod needs a clique with room for itself and for every
		// pending GPU, wherever those land.
		if st.PendingNVLink > 0 {
			return PendingNVLinkPod
		}
		if d.NVLink && d.WholeGPUs > 1 &&
			largestClique(info, st.rawFree) < d.WholeGPUs+st.PendingWhole {
			return NoFreeNVLinkClique
		}
	}
	return st.checkAlignment(d)
}

// checkAlignment is the NUMA part of Check: where the kubelet's topology
// manager refuses a pod it cannot align, its GPUs (or MIG instances) and
// exclusive CPUs must meet on one NUMA node (docs/numa.md).
func (s *NodeState) checkAlignment(d *Demand) Reason {
	if s.Info.NUMAErr != nil {
		return BadNUMATopology
	}
	if err := s.checkNUMA(d); err != nil {
		return numaReason(err)
	}
	return Fits
}

// migModeNote says how many of the node's GPUs are in MIG mode, which are
// offered as MIG instances only (neither whole nor as slices): "" when none.
func migModeNote(st *NodeState) string {
	if st == nil {
		return ""
	}
	n := st.Info.inMIG()
	if n == 0 {
		return ""
	}
	return fmt.Sprintf(" (%d of its %d GPUs are in MIG mode, offered as MIG instances only)", n, len(st.Info.GPUs))
}

// Explain renders reason r (from Check(st, d)) as a sentence.
func Explain(r Reason, st *NodeState, d *Demand) string {
	var req allocator.Request
	model := ""
	if st != nil {
		req = d.Request(st.Info.UnitMiB, st.Info.SliceBaseMiB)
		model = st.Info.Model
	}
	var cores int64
	if st != nil {
		cores = d.SliceOn(st.Info.UnitMiB, st.Info.SliceBaseMiB).Cores
	}
	var m string
	switch r {
	case UnknownNode:
		m = "node not (yet) known to the extender"
	case BadInventory:
		m = fmt.Sprintf("node's %s annotation is malformed", api.AnnotationGPUInventory)
	case NoGPUs:
		m = fmt.Sprintf("node publishes no GPUs (no %s annotation)", api.AnnotationGPUInventory)
	case ModelNotAllowed:
		m = fmt.Sprintf("GPU model %q is not one of %s", model, strings.Join(d.Models, "|"))
	case NoSharedIsolation:
		m = "node cannot isolate shared GPU slices (NRI plugin not connected)"
	case InvalidRequest:
		m = fmt.Sprintf("invalid request: %v", req.Validate())
	case TooFewGPUs:
		m = fmt.Sprintf("node has fewer than %d healthy GPUs", d.WholeGPUs) + migModeNote(st)
	case GPUCountAboveNode:
		m = fmt.Sprintf("%s %d: node has fewer than %d healthy GPUs for slices", api.AnnotationGPUCount, d.gpus(), d.gpus()) + migModeNote(st)
	case NoNVLinkClique:
		n := d.WholeGPUs
		if n == 0 {
			n = d.gpus()
		}
		m = fmt.Sprintf("node has no NVLink clique of %d healthy GPUs", n)
	case SliceTooLarge:
		m = fmt.Sprintf("no GPU of the node shares %d MiB", req.GPUMemMiB)
	case InsufficientCPU:
		m = fmt.Sprintf("less than the pod's %dm CPU free", req.CPUMilli)
	case InsufficientMemory:
		m = fmt.Sprintf("less than the pod's %d MiB memory free", req.MemMiB)
	case InsufficientGPUs:
		m = fmt.Sprintf("fewer than %d whole GPUs free", d.WholeGPUs) + unrecordedHolds(st) + plannedHolds(st)
	case NoGPUForSlice:
		m = fmt.Sprintf("no single GPU has %d MiB and %d cores free", req.GPUMemMiB, cores)
		if d.gpus() > 1 {
			m = fmt.Sprintf("no %d GPUs have %d MiB and %d cores free each, either serving no slices or forming exactly the GPU set of a running multi-GPU slice's MPS daemon", d.gpus(), req.GPUMemMiB, cores)
			if d.NVLink {
				m += ", in one NVLink clique"
			}
		}
	case KeptForWholeGPUs:
		m = "the node is kept for pods planned there that need empty GPUs (whole-GPU pods, or a slice over several GPUs; a reservation, or room that preemption or reclaim frees) until enough of its GPUs are empty: no new slice starts on it meanwhile"
	case NoFreeNVLinkClique:
		m = fmt.Sprintf("no NVLink clique has %d free GPUs", d.WholeGPUs)
		if st != nil && st.PendingWhole > 0 {
			m += fmt.Sprintf(" besides %d GPUs of whole-GPU pods the node agent has not recorded yet", st.PendingWhole)
		}
	case PendingNVLinkPod:
		m = "an NVLink whole-GPU pod on the node waits for the node agent to record its GPUs"
	case BadNUMATopology, NUMANodeTooSmall, NoNUMAFit:
		m = explainNUMA(st, d)
	case NoMIG, NoMIGProfile, InsufficientMIG:
		m = explainMIG(r, st, d)
	default:
		m = "does not fit"
	}
	return "tessera: " + m
}

// nodeSpecific reports an Explain message of reason r that depends on
// node state st beyond its GPU model and units (the filter shares the
// others among the nodes of a model): the pods planned there, the GPUs of
// pods not recorded yet.
func nodeSpecific(r Reason, st *NodeState) bool {
	switch {
	case st == nil:
		return false
	case r == InsufficientGPUs:
		held, _ := plannedWhole(st, false)
		unrecorded, _ := unrecordedWhole(st, false)
		return held > 0 || unrecorded > 0
	case r == NoFreeNVLinkClique:
		return st.PendingWhole > 0
	}
	return false
}

// unrecordedHolds says how many of the node's GPUs pods bound there hold
// beyond the GPUs recorded on them (gpureq.Unrecorded: their GPUs are
// counted, which ones is not known yet), naming the first three: "; 1
// held for pods bound here whose GPUs are not recorded yet: s/initw"; ""
// when none. Before, every refusal for want of whole GPUs said "GPUs held
// for pending whole-GPU pods count as used", also where only recorded
// pods held them.
func unrecordedHolds(st *NodeState) string {
	held, who := unrecordedWhole(st, true)
	if held == 0 {
		return ""
	}
	return fmt.Sprintf("; %d held for pods bound here whose GPUs are not recorded yet: %s", held, firstThree(who))
}

// unrecordedWhole counts the whole GPUs pods bound to node st hold that
// are not recorded yet (PodUse.WholePending) and, with names, names those
// pods (none for a nil st).
func unrecordedWhole(st *NodeState, names bool) (held int, who []string) {
	if st == nil {
		return 0, nil
	}
	for _, u := range st.Pods {
		if !u.Planned && u.WholePending > 0 {
			held += u.WholePending
			if names {
				who = append(who, u.Key())
			}
		}
	}
	return held, who
}

// firstThree lists the first three of names in order, then how many more.
func firstThree(names []string) string {
	sort.Strings(names)
	more := ""
	if len(names) > 3 {
		more = fmt.Sprintf(" and %d more", len(names)-3)
		names = names[:3]
	}
	return strings.Join(names, ", ") + more
}

// plannedHolds says how many of the node's GPUs pods planned there hold
// (a gang's plan, a reservation's, room preemption or reclaim freed for a
// pod), naming the first three: "; 8 held for pods planned here (a plan or
// a reservation): team/ring-0, team/ring-1"; "" when none. A node
// reserved for a gang read only "fewer than 1 whole GPUs free" before.
func plannedHolds(st *NodeState) string {
	held, who := plannedWhole(st, true)
	if held == 0 {
		return ""
	}
	return fmt.Sprintf("; %d held for pods planned here (a gang's plan or reservation, or room freed for a pod): %s", held, firstThree(who))
}

// plannedWhole counts the whole GPUs pods planned on node st hold and,
// with names, names those pods (none for a nil st).
func plannedWhole(st *NodeState, names bool) (held int, who []string) {
	if st == nil {
		return 0, nil
	}
	for _, u := range st.Pods {
		if n := u.WholeGPUs(); u.Planned && n > 0 {
			held += n
			if names {
				who = append(who, u.Key())
			}
		}
	}
	return held, who
}

// largestClique returns the largest number of GPUs satisfying ok in one
// NVLink clique of the node.
func largestClique(info *NodeInfo, ok func(pos int) bool) int {
	best := 0
	for _, c := range info.Cliques {
		n := 0
		for _, p := range c {
			if p < len(info.GPUs) && ok(p) {
				n++
			}
		}
		best = max(best, n)
	}
	if best == 0 {
		// A GPU is its own clique.
		for p := range info.GPUs {
			if ok(p) {
				return 1
			}
		}
	}
	return best
}

// Score evaluates node st for demand d with policy p. ok is false when d
// does not fit st.
func Score(p allocator.Policy, st *NodeState, d *Demand) (score float64, ok bool) {
	if Check(st, d) != Fits {
		return 0, false
	}
	if len(d.MIG) > 0 {
		return st.migScore(d), true
	}
	req := d.Request(st.Info.UnitMiB, st.Info.SliceBaseMiB)
	return p.Evaluate(st.viewForDemand(d), req).Score, true
}

// PreferAligned ranks nodes whose topology manager only prefers NUMA
// alignment (best-effort) below the others when they cannot align the pod
// now: where some fitting nodes can align it and others cannot, those that
// cannot score 0 and the others at least 1. scores are NormalizeScores'
// output, changed in place.
func PreferAligned(scores []int64, fits, aligned []bool) {
	some, notAll := false, false
	for i := range scores {
		if fits[i] {
			some = some || aligned[i]
			notAll = notAll || !aligned[i]
		}
	}
	if !some || !notAll {
		return
	}
	for i := range scores {
		switch {
		case !fits[i]:
		case aligned[i]:
			scores[i] = max(scores[i], 1)
		default:
			scores[i] = 0
		}
	}
}

// Query is one pod's demand prepared for many nodes: Check and Score
// results are memoised on each (immutable) node state, keyed by the
// demand, so that pods of the same shape re-evaluate only the nodes that
// changed since.
type Query struct {
	D    *Demand
	key  string
	hash uint64 // FNV-1a of key
}

// NewQuery prepares d.
func NewQuery(d *Demand) *Query {
	var b strings.Builder
	fmt.Fprintf(&b, "%d/%d/%d/%t/%s/x%d", d.CPUMilli, d.MemMiB, d.WholeGPUs, d.NVLink, strings.Join(d.Models, "|"), d.gpus())
	for _, s := range d.Shares {
		fmt.Fprintf(&b, "/%d:%d:%d", s.Kind, s.MemUnits, s.Cores)
	}
	fmt.Fprintf(&b, "/numa%v%s", d.Align, migKey(d.MIG))
	h := fnv.New64a()
	_, _ = h.Write([]byte(b.String()))
	return &Query{D: d, key: b.String(), hash: h.Sum64()}
}

// Check is Check(st, q.D), memoised.
func (q *Query) Check(st *NodeState) Reason {
	if st == nil {
		return UnknownNode
	}
	if e, ok := st.recall(q.hash, q.key); ok {
		return e.reason
	}
	r := Check(st, q.D)
	st.remember(memoEntry{hash: q.hash, demand: q.key, reason: r})
	return r
}

// Score is Score(p, st, q.D), memoised unless p is randomized.
func (q *Query) Score(p allocator.Policy, st *NodeState) (float64, bool) {
	if st == nil {
		return 0, false
	}
	// Memoised per policy: a learned policy's rebuild is a new policy.
	p = CurrentPolicy(p)
	if allocator.IsRandomized(p) {
		return Score(p, st, q.D)
	}
	e, ok := st.recall(q.hash, q.key)
	if !ok {
		e = memoEntry{hash: q.hash, demand: q.key, reason: Check(st, q.D)}
	}
	if e.reason != Fits {
		if !ok {
			st.remember(e)
		}
		return 0, false
	}
	if e.policy == p {
		return e.score, true
	}
	if len(q.D.MIG) > 0 {
		e.policy, e.score = p, st.migScore(q.D)
		st.remember(e)
		return e.score, true
	}
	req := q.D.Request(st.Info.UnitMiB, st.Info.SliceBaseMiB)
	e.policy, e.score = p, p.Evaluate(st.viewForDemand(q.D), req).Score
	st.remember(e)
	return e.score, true
}

// NormalizeScores maps raw policy scores to 0..10 (min-max over the nodes
// that fit; a node that does not fit scores 0; when all fitting nodes
// score the same, they all get 10).
func NormalizeScores(raw []float64, fits []bool, maxScore int64) []int64 {
	lo, hi := math.Inf(1), math.Inf(-1)
	for i, s := range raw {
		if fits[i] {
			lo, hi = min(lo, s), max(hi, s)
		}
	}
	out := make([]int64, len(raw))
	for i, s := range raw {
		switch {
		case !fits[i]:
		case hi-lo < 1e-9:
			out[i] = maxScore
		default:
			out[i] = int64(math.Round(float64(maxScore) * (s - lo) / (hi - lo)))
		}
	}
	return out
}

// ErrNoFit is wrapped by ChoosePlacement when the pod no longer fits.
var ErrNoFit = errors.New("pod does not fit the node")

// ChoosePlacement decides what pod uid with demand d uses on node st: for
// a shared demand, the GPU the policy prefers, sliced per container; for
// whole GPUs, that many GPUs of the node, pending until the node agent
// records them. The result has no Node set.
func ChoosePlacement(p allocator.Policy, st *NodeState, uid types.UID, d *Demand) (*PodUse, error) {
	if v := Filter(st, d); !v.Fits() {
		return nil, fmt.Errorf("%w: %s", ErrNoFit, v.Message)
	}
	u := &PodUse{UID: uid, CPUMilli: d.CPUMilli, MemMiB: d.MemMiB, Align: d.Align}
	_, u.MIGPending = d.unrecorded(nil)
	switch d.Kind() {
	case allocator.Whole:
		u.WholePending = d.WholeGPUs
		u.NVLink = d.NVLink
	case allocator.Shared:
		info := st.Info
		req := d.Request(info.UnitMiB, info.SliceBaseMiB)
		// A GPU the node offers for slices now, else one it still
		// withholds after whole use (the bind then waits: Offers); where
		// the node aligns on NUMA nodes, one on the NUMA node that has
		// room for the pod's exclusive CPUs too.
		if d.gpus() > 1 {
			pos, err := st.spreadGPUs(d)
			if err != nil {
				return nil, err
			}
			for _, s := range d.Shares {
				a := gpureq.Resolve(s, info.UnitMiB, info.SliceBaseMiB)
				for _, p := range pos {
					g := info.GPUs[p]
					u.Shared = append(u.Shared, SharedUse{Container: s.Name, Kind: s.Kind, UUID: g.UUID, Index: g.Index, MemMiB: a.MemMiB, Cores: a.Cores})
				}
			}
			return u, nil
		}
		zone := st.numaSliceZone(d)
		set, err := allocator.Place(p, st.singleSliceView(inZone(&st.offeredSharedView, info, zone)), req)
		if err != nil {
			set, err = allocator.Place(p, st.singleSliceView(inZone(st.viewFor(allocator.Shared), info, zone)), req)
		}
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrNoFit, err)
		}
		pos := set.Positions()
		if len(pos) != 1 {
			return nil, fmt.Errorf("policy %s chose %d GPUs for a slice", p.Name(), len(pos))
		}
		g := info.GPUs[pos[0]]
		for _, s := range d.Shares {
			a := gpureq.Resolve(s, info.UnitMiB, info.SliceBaseMiB)
			u.Shared = append(u.Shared, SharedUse{Container: s.Name, Kind: s.Kind, UUID: g.UUID, Index: g.Index, MemMiB: a.MemMiB, Cores: a.Cores})
		}
	}
	return u, nil
}

// spreadGPUs are the GPUs (inventory positions) of node st that
// ChoosePlacement puts the slice of d, a demand spanning several GPUs, on:
// GPUs the node offers for slices now, else some it still withholds after
// whole use; where the node aligns on NUMA nodes, on the NUMA node that
// has room for the pod's exclusive CPUs too. It assumes that d fits st
// (Filter).
func (st *NodeState) spreadGPUs(d *Demand) ([]int, error) {
	info := st.Info
	zone := st.numaSliceZone(d)
	pos, ok := st.chooseSliceGPUs(inZone(&st.offeredSharedView, info, zone), d)
	if !ok {
		pos, ok = st.chooseSliceGPUs(inZone(st.viewFor(allocator.Shared), info, zone), d)
	}
	if !ok {
		return nil, fmt.Errorf("%w: %s", ErrNoFit, Explain(NoGPUForSlice, st, d))
	}
	return pos, nil
}

// namesWholeGPUs reports whether a plan for a whole-GPU demand d on st
// names its GPUs (api.GangPlan.GPUs) rather than holding as many of the
// node's by count: not where d asks for no whole GPUs, where pods bound
// there wait for the kubelet to pick their GPUs (it may pick any free
// one), or where the node's topology manager aligns d's GPUs with its
// CPUs (the kubelet's choice then follows the CPUs).
func (st *NodeState) namesWholeGPUs(d *Demand) bool {
	return d.Kind() == allocator.Whole && d.WholeGPUs > 0 && st.PendingWhole == 0 && st.alignsAnywhere(d)
}

// ChooseWholeGPUs names the GPUs a plan holds for a whole-GPU demand d on
// st (api.GangPlan.GPUs): d's count of the node's free GPUs, within one
// NVLink clique when one has enough, as the node's device plugin prefers
// (gpureq.ChooseGPUs; required when d asks for NVLink). ok is false where
// it names none, and the plan then holds as many GPUs of the node by
// count: where namesWholeGPUs says no, or too few are free.
func ChooseWholeGPUs(st *NodeState, d *Demand) ([]api.GPURef, bool) {
	if !st.namesWholeGPUs(d) {
		return nil, false
	}
	c := make([]gpureq.Candidate, len(st.Info.GPUs))
	for p, g := range st.Info.GPUs {
		c[p] = gpureq.Candidate{UUID: g.UUID, Index: g.Index, Room: st.rawFree(p)}
	}
	pos, ok := gpureq.ChooseGPUs(c, d.WholeGPUs, st.Info.Cliques, d.NVLink)
	if !ok {
		return nil, false
	}
	out := make([]api.GPURef, len(pos))
	for i, p := range pos {
		out[i] = st.GPURef(p)
	}
	return out, true
}

// chooseSliceGPUs picks the GPUs (positions) of d's multi-GPU slice in
// view (gpureq.ChooseGPUs: the group rule, an existing set first, the
// NVLink cliques preferred, or required by tessera.dev/nvlink).
func (st *NodeState) chooseSliceGPUs(view *allocator.Node, d *Demand) ([]int, bool) {
	info := st.Info
	req := d.Request(info.UnitMiB, info.SliceBaseMiB)
	return gpureq.ChooseGPUs(st.candidates(view, req), d.gpus(), info.Cliques, d.NVLink)
}

// ReuseShared returns the placement a previous bind attempt recorded in
// the pod's assignment a, when it names a GPU of node st that still has
// room for it (the pod's own use, if counted, excluded). ok is false
// otherwise. While whole-GPU pods on the node wait for the node agent to
// record their GPUs, a completely free GPU has no room: the kubelet may
// have given it to one of them.
func ReuseShared(st *NodeState, uid types.UID, d *Demand, a *api.Assignment) (*PodUse, bool) {
	return reuseShared(st, uid, d, a, false)
}

// ReusePlannedShared is ReuseShared for a gang member bound to the GPU of
// its plan: that GPU was counted as the member's before any pending
// whole-GPU pod of the node was reserved, and such a pod's Binding waits
// until the member is bound (Server.waitPlannedSlices), so the kubelet
// cannot have given it away; it has room unless used otherwise.
func ReusePlannedShared(st *NodeState, uid types.UID, d *Demand, a *api.Assignment) (*PodUse, bool) {
	return reuseShared(st, uid, d, a, true)
}

func reuseShared(st *NodeState, uid types.UID, d *Demand, a *api.Assignment, planned bool) (*PodUse, bool) {
	if d.Kind() != allocator.Shared || a == nil {
		return nil, false
	}
	info := st.Info
	u := &PodUse{UID: uid, CPUMilli: d.CPUMilli, MemMiB: d.MemMiB, Align: d.Align}
	var uuids []string // the slice's GPUs, the same for every share
	for _, s := range d.Shares {
		c := a.Container(s.Name)
		if c == nil || c.Shared == nil || len(c.Shared.Spread)+1 != d.gpus() {
			return nil, false
		}
		if got := c.Shared.UUIDs(); uuids == nil {
			uuids = got
		} else if !slices.Equal(uuids, got) {
			return nil, false
		}
		want := gpureq.Resolve(s, info.UnitMiB, info.SliceBaseMiB)
		if c.Shared.MemoryMiB != want.MemMiB || c.Shared.Cores != want.Cores {
			return nil, false
		}
		for _, uuid := range uuids {
			p := info.position(uuid)
			if p < 0 {
				return nil, false
			}
			u.Shared = append(u.Shared, SharedUse{Container: s.Name, Kind: s.Kind, UUID: uuid, Index: info.GPUs[p].Index, MemMiB: want.MemMiB, Cores: want.Cores})
		}
	}
	// Check the room on those GPUs, without the pod itself.
	var others []*PodUse
	for id, pu := range st.Pods {
		if id != uid {
			others = append(others, pu)
		}
	}
	without := BuildNodeState(info, others)
	if without.groups.Check(uuids) != nil {
		return nil, false
	}
	req := d.Request(info.UnitMiB, info.SliceBaseMiB)
	view := without.viewFor(allocator.Shared)
	if planned {
		raw := without.buildView(0, false)
		view = &raw
	}
	for _, uuid := range uuids {
		g := view.GPUs[info.position(uuid)]
		if g.MilliFree < req.GPUMilli || g.MemFreeMiB < req.GPUMemMiB {
			return nil, false
		}
	}
	return u, true
}

// Preempt returns the victims (by UID) among victims that must go for
// demand d to fit node st at GPU level: victims that use no GPU of the
// node are all kept (the scheduler chose them for its own resources), and
// GPU-using victims are reprieved, highest priority first, while the pod
// still fits without them. Among victims of one priority, those in first
// (the extra members of elastic gangs, the newest first) are reprieved
// last, the first of first the very last: they go before the others. ok is
// false when the pod does not fit even with every victim gone.
func Preempt(st *NodeState, d *Demand, victims []types.UID, first []types.UID) (kept []types.UID, ok bool) {
	if st == nil {
		return nil, false
	}
	gone := make(map[types.UID]bool, len(victims))
	for _, v := range victims {
		gone[v] = true
	}
	fitsWithout := func() bool {
		uses := make([]*PodUse, 0, len(st.Pods))
		for uid, u := range st.Pods {
			if !gone[uid] {
				uses = append(uses, u)
			}
		}
		return Filter(BuildNodeState(st.Info, uses), d).Fits()
	}
	if !fitsWithout() {
		return nil, false
	}
	var gpuVictims []*PodUse
	for _, v := range victims {
		if u, ok := st.Pods[v]; ok && u.HoldsGPUs() {
			gpuVictims = append(gpuVictims, u)
		}
	}
	// Spared first: the highest priority, then the pods not in first, then
	// those late in first.
	rank := make(map[types.UID]int, len(first))
	for i, uid := range first {
		rank[uid] = len(first) - i
	}
	sort.SliceStable(gpuVictims, func(i, j int) bool {
		a, b := gpuVictims[i], gpuVictims[j]
		if a.Priority != b.Priority {
			return a.Priority > b.Priority
		}
		return rank[a.UID] < rank[b.UID]
	})
	for _, u := range gpuVictims {
		delete(gone, u.UID)
		if !fitsWithout() {
			gone[u.UID] = true
		}
	}
	for _, v := range victims {
		if gone[v] {
			kept = append(kept, v)
		}
	}
	return kept, true
}
