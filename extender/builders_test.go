package extender

import (
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/api"
)

// testSealer seals Tessera's annotations in tests.
func testSealer(t testing.TB) *api.Sealer {
	t.Helper()
	s, err := api.NewSealer([]byte("tessera-extender-unit-test-seal-key"))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// gpuUUID is the UUID of GPU i of node node in tests.
func gpuUUID(node string, i int) string {
	h := 0
	for _, c := range node {
		h = h*31 + int(c)
	}
	return fmt.Sprintf("GPU-%08x-%04x", uint32(h), i)
}

type nodeBuilder struct {
	node *corev1.Node
	inv  *api.GPUInventory
	raw  *string
}

func makeNode(name string) *nodeBuilder {
	return &nodeBuilder{node: &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{}},
		Status: corev1.NodeStatus{Allocatable: corev1.ResourceList{
			corev1.ResourceCPU:    resource.MustParse("128"),
			corev1.ResourceMemory: resource.MustParse("1024Gi"),
		}},
	}}
}

// GPUs gives the node n GPUs of model with memMiB each (1 GiB units), all
// in one NVLink clique, shared isolation on.
func (b *nodeBuilder) GPUs(n int, model string, memMiB int) *nodeBuilder {
	inv := &api.GPUInventory{APIVersion: api.Version, Kind: api.KindGPUInventory, MemoryUnitMiB: 1024,
		Resources: []string{string(api.ResourceGPU), string(api.ResourceGPUMemory), string(api.ResourceGPUCore)}, SharedIsolation: true}
	clique := []int{}
	for i := 0; i < n; i++ {
		inv.GPUs = append(inv.GPUs, api.InventoryGPU{Index: i, UUID: gpuUUID(b.node.Name, i), Model: model,
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
	b.inv = inv
	return b
}

// Cliques replaces the NVLink cliques (GPU indices); links between GPUs of
// different cliques become SYS.
func (b *nodeBuilder) Cliques(cs ...[]int) *nodeBuilder {
	of := map[int]int{}
	for k, c := range cs {
		for _, i := range c {
			of[i] = k + 1
		}
	}
	for i := range b.inv.Links {
		for j := range b.inv.Links[i] {
			if i != j && (of[i] == 0 || of[i] != of[j]) {
				b.inv.Links[i][j] = "SYS"
			}
		}
	}
	b.inv.NVLinkCliques = cs
	return b
}

func (b *nodeBuilder) Unhealthy(i int) *nodeBuilder {
	b.inv.GPUs[i].Healthy = false
	b.inv.GPUs[i].Reason = "XID 79"
	return b
}

// WithheldFromWhole and WithheldFromShared name GPUs (indices) the node
// agent withholds from that use in the inventory.
func (b *nodeBuilder) WithheldFromWhole(idx ...int) *nodeBuilder {
	for _, i := range idx {
		b.inv.WithheldFromWhole = append(b.inv.WithheldFromWhole, gpuUUID(b.node.Name, i))
	}
	return b
}

func (b *nodeBuilder) WithheldFromShared(idx ...int) *nodeBuilder {
	for _, i := range idx {
		b.inv.WithheldFromShared = append(b.inv.WithheldFromShared, gpuUUID(b.node.Name, i))
	}
	return b
}

func (b *nodeBuilder) NoIsolation() *nodeBuilder { b.inv.SharedIsolation = false; return b }

func (b *nodeBuilder) CPU(q string) *nodeBuilder {
	b.node.Status.Allocatable[corev1.ResourceCPU] = resource.MustParse(q)
	return b
}

func (b *nodeBuilder) RawInventory(v string) *nodeBuilder { b.raw = &v; return b }

func (b *nodeBuilder) Obj() *corev1.Node {
	n := b.node.DeepCopy()
	switch {
	case b.raw != nil:
		n.Annotations[api.AnnotationGPUInventory] = *b.raw
	case b.inv != nil:
		if err := api.SetGPUInventory(n.Annotations, b.inv); err != nil {
			panic(err)
		}
	}
	return n
}

type podBuilder struct {
	pod    *corev1.Pod
	assign *api.Assignment
	raw    *string
}

func makePod(name string) *podBuilder {
	return &podBuilder{pod: &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID("uid-" + name), Annotations: map[string]string{}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{}, Limits: corev1.ResourceList{}}}}},
	}}
}

func (b *podBuilder) set(name corev1.ResourceName, v int64) {
	q := *resource.NewQuantity(v, resource.DecimalSI)
	b.pod.Spec.Containers[0].Resources.Limits[name] = q
}

// Shared asks for memUnits GPU memory units and cores GPU cores (0: not
// asked).
func (b *podBuilder) Shared(memUnits, cores int64) *podBuilder {
	if memUnits > 0 {
		b.set(api.ResourceGPUMemory, memUnits)
	}
	if cores > 0 {
		b.set(api.ResourceGPUCore, cores)
	}
	return b
}

func (b *podBuilder) Whole(n int64) *podBuilder { b.set(api.ResourceGPU, n); return b }

func (b *podBuilder) CPU(q string) *podBuilder {
	b.pod.Spec.Containers[0].Resources.Requests[corev1.ResourceCPU] = resource.MustParse(q)
	return b
}

func (b *podBuilder) Model(m string) *podBuilder {
	b.pod.Annotations[api.AnnotationGPUModel] = m
	return b
}

func (b *podBuilder) NVLink() *podBuilder {
	b.pod.Annotations[api.AnnotationNVLink] = api.NVLinkRequired
	return b
}

func (b *podBuilder) Priority(p int32) *podBuilder { b.pod.Spec.Priority = &p; return b }

func (b *podBuilder) Node(n string) *podBuilder { b.pod.Spec.NodeName = n; return b }

// On records the pod's shared slice on GPU i of its node.
func (b *podBuilder) On(i int, memMiB, cores int64) *podBuilder {
	if b.assign == nil {
		b.assign = api.NewAssignment()
	}
	b.assign.Containers = append(b.assign.Containers, api.ContainerAssignment{Name: "main",
		Shared: &api.SharedGPU{GPU: api.GPURef{UUID: gpuUUID(b.pod.Spec.NodeName, i), Index: i}, MemoryMiB: memMiB, Cores: cores}})
	return b
}

// Holding records the pod's whole GPUs (indices) on its node.
func (b *podBuilder) Holding(idx ...int) *podBuilder {
	if b.assign == nil {
		b.assign = api.NewAssignment()
	}
	var refs []api.GPURef
	for _, i := range idx {
		refs = append(refs, api.GPURef{UUID: gpuUUID(b.pod.Spec.NodeName, i), Index: i})
	}
	b.assign.Containers = append(b.assign.Containers, api.ContainerAssignment{Name: "main", GPUs: refs})
	return b
}

func (b *podBuilder) RawAssignment(v string) *podBuilder { b.raw = &v; return b }

func (b *podBuilder) Obj() *corev1.Pod {
	p := b.pod.DeepCopy()
	switch {
	case b.raw != nil:
		p.Annotations[api.AnnotationAssignment] = *b.raw
	case b.assign != nil:
		if err := api.SetAssignment(p.Annotations, b.assign); err != nil {
			panic(err)
		}
	}
	return p
}

// newTestCache builds a cache from objects.
func newTestCache(t testing.TB, nodes []*corev1.Node, pods []*corev1.Pod) *Cache {
	t.Helper()
	c := NewCache()
	for _, n := range nodes {
		c.SetNode(n)
	}
	for _, p := range pods {
		if u := c.SetPod(p); u != nil && u.Err != nil {
			t.Logf("pod %s: %v", p.Name, u.Err)
		}
	}
	return c
}

func mustState(t testing.TB, c *Cache, name string) *NodeState {
	t.Helper()
	st, ok := c.Node(name)
	if !ok {
		t.Fatalf("node %s not in cache", name)
	}
	return st
}

// freeOf renders the allocator view of a node as "milli/memMiB" per GPU.
func freeOf(st *NodeState) string {
	parts := make([]string, len(st.view.GPUs))
	for i, g := range st.view.GPUs {
		parts[i] = fmt.Sprintf("%d/%d", g.MilliFree, g.MemFreeMiB)
	}
	return strings.Join(parts, " ")
}
