// Package planner plans the workloads the scheduler extender admits
// itself: gangs (all or nothing, in one topology domain), pods of
// namespaces a Queue serves (in queue order), and, for them, reservations,
// backfill, consolidation and queue reclaim. It is the framework glue
// (informers' listings, API writes, Events) around the pure cores of
// allocator/gang, allocator/queue, allocator/reserve and
// allocator/consolidate, as scheduler-plugins' coscheduling is around its
// core.
//
// It reaches the extender's ledger of nodes only through the interfaces
// declared here (Ledger, Node, Demand); package extender implements them
// (extender.PlannerLedger) and cmd/tessera-extender wires them.
package planner

import (
	"context"
	"errors"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/allocator"
	"github.com/tessera-gpu/tessera/allocator/gang"
	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/internal/eligible"
)

// FieldManager is the field manager of the extender's writes to the API
// server.
const FieldManager = "tessera-extender"

// Ledger is the extender's ledger of nodes as the planner reads and
// reserves it (extender.PlannerLedger).
type Ledger interface {
	// Snapshot returns the state of every node now, by name.
	Snapshot() Snapshot
	// Node returns one node's state now.
	Node(name string) (Node, bool)
	// ReserveGang counts the uses (each on its Node) as reservations,
	// all or none: when the state of any of their nodes is no longer the
	// one in snap, nothing is reserved and the error wraps
	// ErrStaleSnapshot.
	ReserveGang(snap Snapshot, uses []*Use) error
	// ReleaseGang drops the reservations the pods uids hold.
	ReleaseGang(uids []types.UID)
	// Holds returns what the ledger counts of a pod, bound or reserved.
	Holds(uid types.UID) (Held, bool)
	// ParseDemand reads what a pod asks of a node's GPUs.
	ParseDemand(pod *corev1.Pod) (Demand, error)
	// Planned is what member holds on the node of its plan.
	Planned(member *corev1.Pod, plan *api.GangPlan) *Use
}

// ErrStaleSnapshot is wrapped by Ledger.ReserveGang's error when a
// planned node changed since the snapshot the plan was made on.
var ErrStaleSnapshot = errors.New("a planned node changed since the plan was made")

// Snapshot is the state of nodes at one moment, by name.
type Snapshot map[string]Node

// Node is the immutable state of one node of the ledger
// (extender.NodeState).
type Node interface {
	// Name is the node's name; Labels its labels.
	Name() string
	Labels() map[string]string
	// Usable reports whether the node's GPU inventory was read (and is
	// well formed).
	Usable() bool
	// Admits reports whether a pod with constraints p may be scheduled
	// on the node by its cordon, taints and labels (package eligible),
	// and Refusal why not ("" when it may); Accepts also checks the GPU
	// models (none: any) a pod asks for.
	Admits(p eligible.Pod) bool
	Refusal(p eligible.Pod) string
	Accepts(p eligible.Pod, models []string) bool
	// AlignsAnywhere reports whether a pod asking d may be placed on the
	// node without a NUMA check: the node does not require alignment, or
	// what d must align is a single GPU or slice.
	AlignsAnywhere(d Demand) bool
	// FreeCPUMem is the CPU (millicores) and memory (MiB) of the node's
	// allocatable not requested by the pods counted on it.
	FreeCPUMem() (cpuMilli, memMiB int64)
	// GPUCount is the number of GPUs of the inventory; FreeGPUs those
	// fully free for a whole-GPU pod.
	GPUCount() int
	FreeGPUs() int
	// GPURef names the GPU at position pos of the inventory; Healthy
	// says whether it is healthy.
	GPURef(pos int) api.GPURef
	Healthy(pos int) bool
	// Cliques are the node's NVLink cliques, as inventory positions.
	Cliques() [][]int
	// PendingWholeGPUs counts the whole GPUs held by pods whose GPUs the
	// node agent has not named yet.
	PendingWholeGPUs() int
	// NamesWholeGPUs reports whether a plan for the whole-GPU demand d on
	// the node names its GPUs (api.GangPlan.GPUs) rather than holding
	// them by count.
	NamesWholeGPUs(d Demand) bool
	// GPUPods are the pods using the GPU at position pos.
	GPUPods(pos int) []types.UID
	// Occupants are the pods counted on the node, with the GPUs each
	// keeps from a reservation: its whole GPUs (named or not), 1 for
	// slices, 0 for a pod of CPU only.
	Occupants() map[types.UID]int
	// Without is the node without the pods gone (the node itself when it
	// counts none of them); Empty is the node with no pod.
	Without(gone map[types.UID]bool) Node
	Empty() Node
	// Plannable reports whether gang planning may use the node: a well
	// formed inventory, with shared isolation when shared.
	Plannable(shared bool) bool
	// Units are the node's memory unit and core-only slice base; ok is
	// false without an inventory.
	Units() (unitMiB, sliceBaseMiB int64, ok bool)
	// GangNode is the node as gang planning sees it for members asking
	// demands (demands[i] for member i) of GPU kind kind; false while its
	// NVLink cliques are not known (a pending NVLink pod). It admits a
	// slice over several GPUs only where SliceGPUs places it.
	GangNode(kind allocator.Kind, demands []Demand) (gang.Node, bool)
	// SliceGPUs names the GPUs of the node, in index order, that the bind
	// of a pod asking d, a slice over several GPUs (Demand.SpansGPUs > 1),
	// puts it on: its plan names them all. An error says why it does not
	// fit.
	SliceGPUs(d Demand) ([]api.GPURef, error)
}

// Demand is what a pod asks of a node's GPUs (extender.Demand), from
// Ledger.ParseDemand; the planner hands it back to Node.GangNode.
type Demand interface {
	// Kind is the kind of GPU demand (whole, shared or neither).
	Kind() allocator.Kind
	// UsesGPUs reports whether the pod asks for any GPU resource.
	UsesGPUs() bool
	// Whole is the number of whole GPUs the pod holds at its peak.
	Whole() int
	// AsksMIG reports whether the pod asks for MIG instances.
	AsksMIG() bool
	// NeedsNVLink reports whether its GPUs must be in one NVLink clique.
	NeedsNVLink() bool
	// GPUModels are the GPU models it accepts (empty: any).
	GPUModels() []string
	// SpansGPUs is the number of GPUs its slice spans
	// (api.AnnotationGPUCount; 1 for a slice of one GPU), 0 without a
	// slice.
	SpansGPUs() int
	// Request is the allocator request on a node whose memory unit is
	// unitMiB and whose core-only slice base is baseMiB (models left out).
	Request(unitMiB, baseMiB int64) allocator.Request
}

// Use is a planned member as the ledger counts it (Ledger.Planned).
type Use struct {
	UID  types.UID
	Node string
	// WholePending are the whole GPUs it holds on Node, not named yet; a
	// reservation may hold fewer (see held).
	WholePending int
	// Pod and Plan are the member and its plan.
	Pod  *corev1.Pod
	Plan api.GangPlan
}

// Held is what the ledger counts of a pod (Ledger.Holds).
type Held struct {
	Node string
	// Planned marks a member counted on the node of its plan, not bound
	// yet.
	Planned bool
	// GPUs are the UUIDs of the GPUs it holds, whole or a slice of them,
	// as named.
	GPUs []string
	// Pending counts its whole GPUs not named yet; Malformed is set when
	// its assignment could not be read.
	Pending   int
	Malformed bool
}

// Evicter evicts pods through the Eviction API, which honours
// PodDisruptionBudgets (extender.KubeEvicter).
type Evicter interface {
	// Evict evicts the pod; with dryRun the API server only checks that
	// it may.
	Evict(ctx context.Context, pod *corev1.Pod, dryRun bool) error
}

// BudgetOverrider ends a pod its PodDisruptionBudget keeps from eviction
// (extender.KubeEvicter: a deletion conditional on the pod's UID, as
// kube-scheduler's preemption does).
type BudgetOverrider interface {
	DeletePastBudget(ctx context.Context, pod *corev1.Pod) error
}

// EventRecorder records Kubernetes Events (record.EventRecorder fits).
type EventRecorder interface {
	Eventf(object runtime.Object, eventtype, reason, messageFmt string, args ...any)
}

// without returns snap with the pods gone removed from their nodes'
// states (unchanged nodes are shared).
func without(snap Snapshot, gone map[types.UID]bool) Snapshot {
	if len(gone) == 0 {
		return snap
	}
	out := make(Snapshot, len(snap))
	for n, st := range snap {
		out[n] = st.Without(gone)
	}
	return out
}
