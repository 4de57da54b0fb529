package extender

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/allocator"
	"github.com/tessera-gpu/tessera/api"
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
	SliceTooLarge        Reason = "slice-larger-than-any-gpu"
	InsufficientCPU      Reason = "insufficient-cpu"
	InsufficientMemory   Reason = "insufficient-memory"
	InsufficientGPUs     Reason = "insufficient-free-gpus"
	NoGPUForSlice        Reason = "no-gpu-for-slice"
	NoFreeNVLinkClique   Reason = "no-free-nvlink-clique"
	reasonAllocatorOther Reason = "other"
)

// Unresolvable reports whether preempting pods on the node cannot help.
func (r Reason) Unresolvable() bool {
	switch r {
	case BadInventory, NoGPUs, ModelNotAllowed, NoSharedIsolation, InvalidRequest, TooFewGPUs, NoNVLinkClique, SliceTooLarge:
		return true
	}
	return false
}

// Verdict is the filter's answer for one node.
type Verdict struct {
	Reason Reason
	// Message explains the reason with the numbers involved.
	Message string
}

// Fits reports whether the pod fits.
func (v Verdict) Fits() bool { return v.Reason == Fits }

func reject(r Reason, format string, args ...any) Verdict {
	return Verdict{Reason: r, Message: "tessera: " + fmt.Sprintf(format, args...)}
}

// Filter decides whether demand d fits node state st (nil: unknown node).
func Filter(st *NodeState, d *Demand) Verdict {
	if st == nil {
		return reject(UnknownNode, "node not (yet) known to the extender")
	}
	if d.Kind() == allocator.CPUOnly {
		return Verdict{}
	}
	info := st.Info
	if info.Err != nil {
		return reject(BadInventory, "node GPU inventory is malformed: %v", info.Err)
	}
	if !info.HasInventory || len(info.GPUs) == 0 {
		return reject(NoGPUs, "node publishes no GPUs (no %s annotation)", api.AnnotationGPUInventory)
	}
	if len(d.Models) > 0 && !modelAllowed(info.Model, d.Models) {
		return reject(ModelNotAllowed, "GPU model %q is not one of %s", info.Model, strings.Join(d.Models, "|"))
	}
	if d.Kind() == allocator.Shared && !info.SharedIsolation {
		return reject(NoSharedIsolation, "node cannot isolate shared GPUs (NRI plugin not connected)")
	}
	req := d.Request(info.UnitMiB, info.gpuMemMiB())
	if err := req.Validate(); err != nil {
		return reject(InvalidRequest, "%v", err)
	}
	switch d.Kind() {
	case allocator.Whole:
		healthy := 0
		for _, g := range info.GPUs {
			if g.Healthy {
				healthy++
			}
		}
		if healthy < d.WholeGPUs {
			return reject(TooFewGPUs, "pod needs %d whole GPUs, node has %d healthy GPUs", d.WholeGPUs, healthy)
		}
		if d.NVLink && d.WholeGPUs > 1 && largestClique(info, func(p int) bool { return info.GPUs[p].Healthy }) < d.WholeGPUs {
			return reject(NoNVLinkClique, "pod needs %d whole GPUs in one NVLink clique, the node's largest healthy clique has %d", d.WholeGPUs,
				largestClique(info, func(p int) bool { return info.GPUs[p].Healthy }))
		}
	case allocator.Shared:
		var maxMem int64
		for _, g := range info.GPUs {
			if g.Healthy {
				maxMem = max(maxMem, g.MemMiB)
			}
		}
		if req.GPUMemMiB > maxMem {
			return reject(SliceTooLarge, "pod needs %d MiB of one GPU, the node's largest healthy GPU shares %d MiB", req.GPUMemMiB, maxMem)
		}
	}
	v := &st.view
	switch allocator.Fit(v, req) {
	case allocator.Fits:
	case allocator.InsufficientCPU:
		return reject(InsufficientCPU, "pod needs %dm CPU, node has %dm free", req.CPUMilli, v.CPUMilliFree)
	case allocator.InsufficientMemory:
		return reject(InsufficientMemory, "pod needs %d MiB memory, node has %d MiB free", req.MemMiB, v.MemMiBFree)
	case allocator.InsufficientWholeGPUs:
		return reject(InsufficientGPUs, "pod needs %d whole GPUs, node has %d free (%d held for pending whole-GPU pods)", req.GPUs, st.FreeGPUs(), st.PendingWhole)
	case allocator.NoGPUForSlice:
		var bestMem, bestMilli int64
		for _, g := range v.GPUs {
			bestMem, bestMilli = max(bestMem, g.MemFreeMiB), max(bestMilli, g.MilliFree)
		}
		_, cores := d.SharedTotals()
		return reject(NoGPUForSlice, "pod needs %d MiB and %d cores of one GPU; no GPU has both free (most free: %d MiB, %d cores)",
			req.GPUMemMiB, cores, bestMem, bestMilli/(allocator.MilliPerGPU/api.CoresPerGPU))
	case allocator.ModelNotAllowed:
		return reject(ModelNotAllowed, "GPU model %q is not allowed", info.Model)
	case allocator.NoGPUs:
		return reject(NoGPUs, "node has no GPUs")
	case allocator.InvalidRequest:
		return reject(InvalidRequest, "invalid request %s", req)
	default:
		return reject(reasonAllocatorOther, "does not fit")
	}
	if d.Kind() == allocator.Whole && d.NVLink && d.WholeGPUs > 1 {
		if free := largestClique(info, func(p int) bool { return v.GPUs[p].FullyFree() }); free < d.WholeGPUs {
			return reject(NoFreeNVLinkClique, "pod needs %d free GPUs in one NVLink clique, the node has at most %d", d.WholeGPUs, free)
		}
	}
	return Verdict{}
}

// modelAllowed reports whether model matches one of want.
func modelAllowed(model string, want []string) bool {
	for _, w := range want {
		if api.ModelMatches(model, w) {
			return true
		}
	}
	return false
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
	if !Filter(st, d).Fits() {
		return 0, false
	}
	req := d.Request(st.Info.UnitMiB, st.Info.gpuMemMiB())
	return p.Evaluate(&st.view, req).Score, true
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
	u := &PodUse{UID: uid, CPUMilli: d.CPUMilli, MemMiB: d.MemMiB}
	switch d.Kind() {
	case allocator.Whole:
		u.WholePending = d.WholeGPUs
	case allocator.Shared:
		info := st.Info
		req := d.Request(info.UnitMiB, info.gpuMemMiB())
		set, err := allocator.Place(p, &st.view, req)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrNoFit, err)
		}
		pos := set.Positions()
		if len(pos) != 1 {
			return nil, fmt.Errorf("policy %s chose %d GPUs for a slice", p.Name(), len(pos))
		}
		g := info.GPUs[pos[0]]
		for _, s := range d.Shares {
			u.Shared = append(u.Shared, SharedUse{Container: s.Name, UUID: g.UUID, Index: g.Index, MemMiB: ShareMiB(s, info.UnitMiB, info.gpuMemMiB()), Cores: s.Cores})
		}
	}
	return u, nil
}

// ReuseShared returns the placement a previous bind attempt recorded in
// the pod's assignment a, when it names a GPU of node st that still has
// room for it (the pod's own use, if counted, excluded). ok is false
// otherwise.
func ReuseShared(st *NodeState, uid types.UID, d *Demand, a *api.Assignment) (*PodUse, bool) {
	if d.Kind() != allocator.Shared || a == nil {
		return nil, false
	}
	info := st.Info
	u := &PodUse{UID: uid, CPUMilli: d.CPUMilli, MemMiB: d.MemMiB}
	uuid := ""
	for _, s := range d.Shares {
		c := a.Container(s.Name)
		if c == nil || c.Shared == nil || (uuid != "" && c.Shared.GPU.UUID != uuid) {
			return nil, false
		}
		uuid = c.Shared.GPU.UUID
		want := ShareMiB(s, info.UnitMiB, info.gpuMemMiB())
		if c.Shared.MemoryMiB != want || c.Shared.Cores != s.Cores {
			return nil, false
		}
		u.Shared = append(u.Shared, SharedUse{Container: s.Name, UUID: uuid, MemMiB: want, Cores: s.Cores})
	}
	p := info.position(uuid)
	if p < 0 {
		return nil, false
	}
	for i := range u.Shared {
		u.Shared[i].Index = info.GPUs[p].Index
	}
	// Check the room on that GPU, without the pod itself.
	var others []*PodUse
	for id, pu := range st.Pods {
		if id != uid {
			others = append(others, pu)
		}
	}
	without := BuildNodeState(info, others)
	req := d.Request(info.UnitMiB, info.gpuMemMiB())
	g := without.view.GPUs[p]
	if g.MilliFree < req.GPUMilli || g.MemFreeMiB < req.GPUMemMiB {
		return nil, false
	}
	return u, true
}

// Preempt returns the victims (by UID) among victims that must go for
// demand d to fit node st at GPU level: victims that use no GPU of the
// node are all kept (the scheduler chose them for its own resources), and
// GPU-using victims are reprieved, highest priority first, while the pod
// still fits without them. ok is false when the pod does not fit even with
// every victim gone.
func Preempt(st *NodeState, d *Demand, victims []types.UID) (kept []types.UID, ok bool) {
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
		if u, ok := st.Pods[v]; ok && (len(u.Shared) > 0 || len(u.Whole) > 0 || u.WholePending > 0) {
			gpuVictims = append(gpuVictims, u)
		}
	}
	sort.SliceStable(gpuVictims, func(i, j int) bool { return gpuVictims[i].Priority > gpuVictims[j].Priority })
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
