// Package testbuild builds the Nodes and Pods of the extender's tests
// (package extender and extender/planner): nodes with a GPU inventory,
// pods asking for GPUs, their assignments and seals.
package testbuild

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/tessera-gpu/tessera/api"
)

// Sealer seals Tessera's annotations in tests.
func Sealer(t testing.TB) *api.Sealer {
	t.Helper()
	s, err := api.NewSealer([]byte("tessera-extender-unit-test-seal-key"))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// GPUUUID is the UUID of GPU i of node node in tests.
func GPUUUID(node string, i int) string {
	h := 0
	for _, c := range node {
		h = h*31 + int(c)
	}
	return fmt.Sprintf("GPU-%08x-%04x", uint32(h), i)
}

// NodeBuilder builds a Node with a GPU inventory.
type NodeBuilder struct {
	// Node is the node built; Inv its inventory (nil: none), which
	// Obj writes into its annotation.
	Node *corev1.Node
	Inv  *api.GPUInventory
	raw  *string
}

// Node starts a node named name (128 CPUs, 1 TiB memory, no GPU).
func Node(name string) *NodeBuilder {
	return &NodeBuilder{Node: &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{}},
		Status: corev1.NodeStatus{Allocatable: corev1.ResourceList{
			corev1.ResourceCPU:    resource.MustParse("128"),
			corev1.ResourceMemory: resource.MustParse("1024Gi"),
		}},
	}}
}

// GPUs gives the node n GPUs of model with memMiB each (1 GiB units), all
// in one NVLink clique, shared isolation on.
func (b *NodeBuilder) GPUs(n int, model string, memMiB int) *NodeBuilder {
	inv := &api.GPUInventory{APIVersion: api.Version, Kind: api.KindGPUInventory, MemoryUnitMiB: 1024,
		Resources: []string{string(api.ResourceGPU), string(api.ResourceGPUMemory), string(api.ResourceGPUCore)}, SharedIsolation: true}
	clique := []int{}
	for i := 0; i < n; i++ {
		inv.GPUs = append(inv.GPUs, api.InventoryGPU{Index: i, UUID: GPUUUID(b.Node.Name, i), Model: model,
			MemoryMiB: uint64(memMiB), MemoryUnits: memMiB / 1024, NUMANode: 0, Healthy: true})
		row := make([]string, n)
		for j := range row {
			row[j] = "NV12"
			if i == j {
				row[j] = "X"
			}
		}
		inv.Links = append(inv.Links, row)
		clique = append(clique, i)
	}
	if n > 0 {
		inv.NVLinkCliques = [][]int{clique}
	}
	b.Inv = inv
	return b
}

// Cliques replaces the NVLink cliques (GPU indices); links between GPUs of
// different cliques become SYS.
func (b *NodeBuilder) Cliques(cs ...[]int) *NodeBuilder {
	of := map[int]int{}
	for k, c := range cs {
		for _, i := range c {
			of[i] = k + 1
		}
	}
	for i := range b.Inv.Links {
		for j := range b.Inv.Links[i] {
			if i != j && (of[i] == 0 || of[i] != of[j]) {
				b.Inv.Links[i][j] = "SYS"
			}
		}
	}
	b.Inv.NVLinkCliques = cs
	return b
}

// Unhealthy marks GPU i unhealthy (XID 79).
func (b *NodeBuilder) Unhealthy(i int) *NodeBuilder {
	b.Inv.GPUs[i].Healthy = false
	b.Inv.GPUs[i].Reason = "XID 79"
	return b
}

// WithheldFromWhole and WithheldFromShared name GPUs (indices) the node
// agent withholds from that use in the inventory.
func (b *NodeBuilder) WithheldFromWhole(idx ...int) *NodeBuilder {
	for _, i := range idx {
		b.Inv.WithheldFromWhole = append(b.Inv.WithheldFromWhole, GPUUUID(b.Node.Name, i))
	}
	return b
}

// WithheldFromShared: see WithheldFromWhole.
func (b *NodeBuilder) WithheldFromShared(idx ...int) *NodeBuilder {
	for _, i := range idx {
		b.Inv.WithheldFromShared = append(b.Inv.WithheldFromShared, GPUUUID(b.Node.Name, i))
	}
	return b
}

// NoIsolation turns shared isolation off.
func (b *NodeBuilder) NoIsolation() *NodeBuilder { b.Inv.SharedIsolation = false; return b }

// CPU sets the node's allocatable CPU.
func (b *NodeBuilder) CPU(q string) *NodeBuilder {
	b.Node.Status.Allocatable[corev1.ResourceCPU] = resource.MustParse(q)
	return b
}

// RawInventory writes v as the inventory annotation, as is.
func (b *NodeBuilder) RawInventory(v string) *NodeBuilder { b.raw = &v; return b }

// Obj returns a copy of the node.
func (b *NodeBuilder) Obj() *corev1.Node {
	n := b.Node.DeepCopy()
	switch {
	case b.raw != nil:
		n.Annotations[api.AnnotationGPUInventory] = *b.raw
	case b.Inv != nil:
		if err := api.SetGPUInventory(n.Annotations, b.Inv); err != nil {
			panic(err)
		}
	}
	return n
}

// PodBuilder builds a pod of one container "main" in namespace default.
type PodBuilder struct {
	// Pod is the pod built; Assign its assignment (nil: none), which Obj
	// writes into its annotation.
	Pod    *corev1.Pod
	Assign *api.Assignment
	raw    *string
}

// Pod starts a pod named name, UID "uid-<name>", asking for nothing.
func Pod(name string) *PodBuilder {
	return &PodBuilder{Pod: &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID("uid-" + name), Annotations: map[string]string{}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{}, Limits: corev1.ResourceList{}}}}},
	}}
}

// Limit sets the limit of resource name of container main to v.
func (b *PodBuilder) Limit(name corev1.ResourceName, v int64) *PodBuilder {
	q := *resource.NewQuantity(v, resource.DecimalSI)
	b.Pod.Spec.Containers[0].Resources.Limits[name] = q
	return b
}

// Shared asks for memUnits GPU memory units and cores GPU cores (0: not
// asked).
func (b *PodBuilder) Shared(memUnits, cores int64) *PodBuilder {
	if memUnits > 0 {
		b.Limit(api.ResourceGPUMemory, memUnits)
	}
	if cores > 0 {
		b.Limit(api.ResourceGPUCore, cores)
	}
	return b
}

// Whole asks for n whole GPUs.
func (b *PodBuilder) Whole(n int64) *PodBuilder { b.Limit(api.ResourceGPU, n); return b }

// CPU requests q CPU.
func (b *PodBuilder) CPU(q string) *PodBuilder {
	b.Pod.Spec.Containers[0].Resources.Requests[corev1.ResourceCPU] = resource.MustParse(q)
	return b
}

// Model restricts GPU models (api.AnnotationGPUModel).
func (b *PodBuilder) Model(m string) *PodBuilder {
	b.Pod.Annotations[api.AnnotationGPUModel] = m
	return b
}

// NVLink requires one NVLink clique.
func (b *PodBuilder) NVLink() *PodBuilder {
	b.Pod.Annotations[api.AnnotationNVLink] = api.NVLinkRequired
	return b
}

// GPUCount spreads the pod's slice over n GPUs (api.AnnotationGPUCount).
func (b *PodBuilder) GPUCount(n string) *PodBuilder {
	b.Pod.Annotations[api.AnnotationGPUCount] = n
	return b
}

// Priority sets the pod's priority.
func (b *PodBuilder) Priority(p int32) *PodBuilder { b.Pod.Spec.Priority = &p; return b }

// Node binds the pod to node n.
func (b *PodBuilder) Node(n string) *PodBuilder { b.Pod.Spec.NodeName = n; return b }

// On records the pod's shared slice on GPU i of its node.
func (b *PodBuilder) On(i int, memMiB, cores int64) *PodBuilder {
	if b.Assign == nil {
		b.Assign = api.NewAssignment()
	}
	b.Assign.Containers = append(b.Assign.Containers, api.ContainerAssignment{Name: "main",
		Shared: &api.SharedGPU{GPU: api.GPURef{UUID: GPUUUID(b.Pod.Spec.NodeName, i), Index: i}, MemoryMiB: memMiB, Cores: cores}})
	return b
}

// Holding records the pod's whole GPUs (indices) on its node.
func (b *PodBuilder) Holding(idx ...int) *PodBuilder {
	if b.Assign == nil {
		b.Assign = api.NewAssignment()
	}
	var refs []api.GPURef
	for _, i := range idx {
		refs = append(refs, api.GPURef{UUID: GPUUUID(b.Pod.Spec.NodeName, i), Index: i})
	}
	b.Assign.Containers = append(b.Assign.Containers, api.ContainerAssignment{Name: "main", GPUs: refs})
	return b
}

// RawAssignment writes v as the assignment annotation, as is.
func (b *PodBuilder) RawAssignment(v string) *PodBuilder { b.raw = &v; return b }

// Obj returns a copy of the pod.
func (b *PodBuilder) Obj() *corev1.Pod {
	p := b.Pod.DeepCopy()
	switch {
	case b.raw != nil:
		p.Annotations[api.AnnotationAssignment] = *b.raw
	case b.Assign != nil:
		if err := api.SetAssignment(p.Annotations, b.Assign); err != nil {
			panic(err)
		}
	}
	return p
}

// MIGUUID is instance k of GPU i of node.
func MIGUUID(node string, i, k int) string {
	h := 0
	for _, c := range node {
		h = h*31 + int(c)
	}
	return fmt.Sprintf("MIG-%08x-%04x-%04x-0000-000000000000", uint32(h), i, k)
}

// HoldingMIG records the pod's MIG instances (GPU, instance) on its node.
func (b *PodBuilder) HoldingMIG(profile string, at ...[2]int) *PodBuilder {
	if b.Assign == nil {
		b.Assign = api.NewAssignment()
	}
	var refs []api.MIGRef
	for _, gk := range at {
		refs = append(refs, api.MIGRef{UUID: MIGUUID(b.Pod.Spec.NodeName, gk[0], gk[1]), Profile: profile,
			GPU: api.GPURef{UUID: GPUUUID(b.Pod.Spec.NodeName, gk[0]), Index: gk[0]}})
	}
	b.Assign.Containers = append(b.Assign.Containers, api.ContainerAssignment{Name: "main", MIG: refs})
	return b
}

// EightGPUNodes are n nodes n0..n<n-1> of 8 H100s (80 GiB) each.
func EightGPUNodes(n int) []*corev1.Node {
	var out []*corev1.Node
	for i := range n {
		out = append(out, Node(fmt.Sprintf("n%d", i)).GPUs(8, "H100", 81920).Obj())
	}
	return out
}

// Recorder records Events as "reason: message"; Mu guards Events.
type Recorder struct {
	Mu     sync.Mutex
	Events []string
}

// Eventf records an Event.
func (f *Recorder) Eventf(_ runtime.Object, _, reason, format string, args ...any) {
	f.Mu.Lock()
	defer f.Mu.Unlock()
	f.Events = append(f.Events, reason+": "+fmt.Sprintf(format, args...))
}

// PreemptClient records evictions and plans; pods named in PDB refuse
// eviction.
type PreemptClient struct {
	Evicted []string
	// PastBudget are the evicted pods deleted past their budgets.
	PastBudget []string
	Plans      map[string]string
	PDB        map[string]bool
}

// Evict evicts pod (records it unless dryRun), or refuses as a budget does
// (429, the API server's words).
func (f *PreemptClient) Evict(_ context.Context, pod *corev1.Pod, dryRun bool) error {
	if f.PDB[pod.Name] {
		return apierrors.NewTooManyRequests("Cannot evict pod as it would violate the pod's disruption budget.", 0)
	}
	if !dryRun {
		f.Evicted = append(f.Evicted, pod.Name)
	}
	return nil
}

// DeletePastBudget deletes pod whatever its budget (records it in Evicted
// and PastBudget).
func (f *PreemptClient) DeletePastBudget(_ context.Context, pod *corev1.Pod) error {
	f.Evicted = append(f.Evicted, pod.Name)
	f.PastBudget = append(f.PastBudget, pod.Name)
	return nil
}

// SetPlan records the pod's plan.
func (f *PreemptClient) SetPlan(_ context.Context, pod *corev1.Pod, value string) error {
	if f.Plans == nil {
		f.Plans = map[string]string{}
	}
	f.Plans[pod.Name] = value
	return nil
}

// Objects is a fixed list of objects of a custom resource.
type Objects []*unstructured.Unstructured

// Objects returns them.
func (q Objects) Objects() []*unstructured.Unstructured { return q }

// QueueObj is a Queue object with a guarantee of GPUs and, when usage >
// 0, a usage history of that many GPU-seconds written at updated.
func QueueObj(t testing.TB, name, parent string, namespaces []string, guaranteed int64, usage float64, updated time.Time) *unstructured.Unstructured {
	t.Helper()
	q := &api.Queue{Name: name, Parent: parent, Namespaces: namespaces, Resources: map[corev1.ResourceName]api.QueueResource{
		api.ResourceGPU: {Guaranteed: guaranteed, Weight: 1},
	}}
	u := q.Unstructured()
	if usage > 0 {
		st := api.QueueStatus{Usage: map[corev1.ResourceName]float64{api.ResourceGPU: usage}, UsageUpdated: updated}
		u.Object["status"] = st.Object()
	}
	if _, err := api.QueueFromUnstructured(u); err != nil {
		t.Fatal(err)
	}
	return u
}

// Counter reads the child of label of counter tessera_extender_<which>_total
// in reg (0 when absent).
func Counter(t testing.TB, reg *prometheus.Registry, which, label string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "tessera_extender_"+which+"_total" {
			for _, m := range mf.GetMetric() {
				if m.GetLabel()[0].GetValue() == label {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}
