package extenderenv

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/test/framework/controlplane"
)

// Models used by the tests.
const (
	A100 = "NVIDIA A100-SXM4-40GB"
	H100 = "NVIDIA H100 80GB HBM3"
)

// GPUUUID is the UUID of GPU i of node (stable, distinct per node).
func GPUUUID(node string, i int) string {
	h := uint32(2166136261)
	for _, c := range []byte(node) {
		h = (h ^ uint32(c)) * 16777619
	}
	return fmt.Sprintf("GPU-%08x-%04x", h, i)
}

// NodeSpec describes a fake GPU node.
type NodeSpec struct {
	Name string
	GPUs int
	// Model defaults to H100, MemMiB to the model's memory (81920 for the
	// H100, else 40960).
	Model  string
	MemMiB int
	// Cliques are NVLink cliques of GPU indices; nil: all GPUs in one
	// NVSwitch clique.
	Cliques [][]int
	Labels  map[string]string
}

func (s NodeSpec) withDefaults() NodeSpec {
	if s.Model == "" {
		s.Model = H100
	}
	if s.MemMiB == 0 {
		s.MemMiB = 40960
		if s.Model == H100 {
			s.MemMiB = 81920
		}
	}
	return s
}

// Inventory is what the node agent would publish for s.
func Inventory(s NodeSpec) *api.GPUInventory {
	s = s.withDefaults()
	inv := &api.GPUInventory{APIVersion: api.Version, Kind: api.KindGPUInventory, MemoryUnitMiB: 1024, SharedIsolation: true,
		Resources: []string{string(api.ResourceGPU), string(api.ResourceGPUMemory), string(api.ResourceGPUCore)}}
	cliques := s.Cliques
	if cliques == nil {
		all := make([]int, s.GPUs)
		for i := range all {
			all[i] = i
		}
		cliques = [][]int{all}
	}
	of := map[int]int{}
	for k, c := range cliques {
		for _, i := range c {
			of[i] = k + 1
		}
	}
	for i := 0; i < s.GPUs; i++ {
		inv.GPUs = append(inv.GPUs, api.InventoryGPU{Index: i, UUID: GPUUUID(s.Name, i), Model: s.Model,
			MemoryMiB: uint64(s.MemMiB), MemoryUnits: s.MemMiB / 1024, NUMANode: i * 2 / s.GPUs, Healthy: true})
		row := make([]string, s.GPUs)
		for j := range row {
			switch {
			case i == j:
				row[j] = "X"
			case of[i] != 0 && of[i] == of[j]:
				row[j] = "NVS18"
			default:
				row[j] = "SYS"
			}
		}
		inv.Links = append(inv.Links, row)
	}
	inv.NVLinkCliques = cliques
	return inv
}

// NodeOptions is the controlplane.NodeOptions of a Node as a node agent
// would leave it: the inventory annotation, tessera.dev/gpu, gpu-memory
// and gpu-core capacity, and room for 250 pods.
func NodeOptions(s NodeSpec) (controlplane.NodeOptions, error) {
	s = s.withDefaults()
	ann := map[string]string{}
	if err := api.SetGPUInventory(ann, Inventory(s)); err != nil {
		return controlplane.NodeOptions{}, err
	}
	q := func(n int) resource.Quantity { return *resource.NewQuantity(int64(n), resource.DecimalSI) }
	capacity := v1.ResourceList{
		v1.ResourceCPU:        resource.MustParse("256"),
		v1.ResourceMemory:     resource.MustParse("2048Gi"),
		v1.ResourcePods:       resource.MustParse("250"),
		api.ResourceGPU:       q(s.GPUs),
		api.ResourceGPUMemory: q(s.GPUs * (s.MemMiB / 1024)),
		api.ResourceGPUCore:   q(s.GPUs * api.CoresPerGPU),
	}
	return controlplane.NodeOptions{Name: s.Name, Labels: s.Labels, Annotations: ann, Capacity: capacity}, nil
}

// CreateNode makes a ready, untainted Node for s (see NodeOptions).
func (e *Env) CreateNode(t testing.TB, s NodeSpec) {
	t.Helper()
	o, err := NodeOptions(s)
	if err != nil {
		t.Fatal(err)
	}
	n, err := e.CP.CreateReadyNode(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	if len(n.Spec.Taints) > 0 {
		t.Fatalf("node %s has taints %v", s.Name, n.Spec.Taints)
	}
}

// PodSpec describes a pod with one container "main" that asks for 100m
// CPU and the given GPU resources (as limits).
type PodSpec struct {
	Name string
	// Namespace defaults to DefaultNamespace.
	Namespace string
	// MemUnits (tessera.dev/gpu-memory), Cores (tessera.dev/gpu-core) and
	// GPUs (tessera.dev/gpu); zero leaves a resource out.
	MemUnits, Cores, GPUs int64
	// Model is the tessera.dev/gpu-model annotation; NVLink requires one
	// NVLink clique.
	Model  string
	NVLink bool
	// Selector is the pod's nodeSelector.
	Selector map[string]string
	// Node and Assign pre-bind the pod (an existing workload); Assign is
	// written sealed, right after the create.
	Node   string
	Assign *api.Assignment
	// PriorityClass names a PriorityClass.
	PriorityClass string
	Labels        map[string]string
	Annotations   map[string]string

	// Gang, when set, makes the pod a member of gang Gang by tessera's
	// annotations (GangMinMember is then required; GangTimeoutSeconds and
	// GangTopology are optional) and adds the gang scheduling gate, as the
	// admission webhook would (the test API server cannot call the
	// webhook). For a PodGroup member, set Labels[api.LabelPodGroup] and
	// Gated instead.
	Gang               string
	GangMinMember      int
	GangTimeoutSeconds int
	GangTopology       string
	// Gated adds the gang scheduling gate (implied by Gang).
	Gated bool
}

// Pod builds the pod of s without creating it.
func (s PodSpec) Pod() *v1.Pod {
	limits := v1.ResourceList{}
	set := func(r v1.ResourceName, v int64) {
		if v > 0 {
			limits[r] = *resource.NewQuantity(v, resource.DecimalSI)
		}
	}
	set(api.ResourceGPUMemory, s.MemUnits)
	set(api.ResourceGPUCore, s.Cores)
	set(api.ResourceGPU, s.GPUs)
	ns := s.Namespace
	if ns == "" {
		ns = DefaultNamespace
	}
	p := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: s.Name, Namespace: ns, Labels: map[string]string{}, Annotations: map[string]string{}},
		Spec: v1.PodSpec{
			NodeSelector:      s.Selector,
			NodeName:          s.Node,
			PriorityClassName: s.PriorityClass,
			Containers: []v1.Container{{Name: "main", Image: "registry.k8s.io/pause:3.10",
				Resources: v1.ResourceRequirements{Limits: limits, Requests: v1.ResourceList{v1.ResourceCPU: resource.MustParse("100m")}}}},
		},
	}
	for k, v := range s.Labels {
		p.Labels[k] = v
	}
	for k, v := range s.Annotations {
		p.Annotations[k] = v
	}
	if s.Model != "" {
		p.Annotations[api.AnnotationGPUModel] = s.Model
	}
	if s.NVLink {
		p.Annotations[api.AnnotationNVLink] = api.NVLinkRequired
	}
	if s.Gang != "" {
		p.Annotations[api.AnnotationGang] = s.Gang
		if s.GangMinMember > 0 {
			p.Annotations[api.AnnotationGangMinMember] = fmt.Sprint(s.GangMinMember)
		}
		if s.GangTimeoutSeconds > 0 {
			p.Annotations[api.AnnotationGangTimeout] = fmt.Sprint(s.GangTimeoutSeconds)
		}
		if s.GangTopology != "" {
			p.Annotations[api.AnnotationGangTopology] = s.GangTopology
		}
	}
	if s.Gang != "" || s.Gated {
		p.Spec.SchedulingGates = []v1.PodSchedulingGate{{Name: api.SchedulingGateGang}}
	}
	return p
}

// CreatePod creates the pod of s. With Assign, it then records the
// assignment, sealed as Tessera seals it (the seal names the pod's UID, so
// it can only be written once the pod exists).
func (e *Env) CreatePod(t testing.TB, s PodSpec) *v1.Pod {
	t.Helper()
	out, err := createPod(t.Context(), e.Client, e.Sealer, s)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// createPod creates the pod of s and, with s.Assign, patches its sealed
// assignment onto it.
func createPod(ctx context.Context, client kubernetes.Interface, sealer *api.Sealer, s PodSpec) (*v1.Pod, error) {
	p := s.Pod()
	pods := client.CoreV1().Pods(p.Namespace)
	out, err := pods.Create(ctx, p, metav1.CreateOptions{})
	if err != nil || s.Assign == nil {
		return out, err
	}
	annotations, err := sealer.AssignmentAnnotations(out.UID, s.Assign)
	if err != nil {
		return nil, fmt.Errorf("pod %s/%s: %w", out.Namespace, out.Name, err)
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": annotations}})
	if err != nil {
		return nil, err
	}
	if out, err = pods.Patch(ctx, out.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return nil, fmt.Errorf("record the assignment of pod %s/%s: %w", p.Namespace, p.Name, err)
	}
	return out, nil
}

// GetPod reads a pod.
func (e *Env) GetPod(t testing.TB, ns, name string) *v1.Pod {
	t.Helper()
	p, err := e.Client.CoreV1().Pods(ns).Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// DeletePod deletes a pod at once (grace period 0), as a kubelet would
// finish a terminating pod; a pod already gone is no error.
func (e *Env) DeletePod(t testing.TB, ns, name string) {
	t.Helper()
	zero := int64(0)
	err := e.Client.CoreV1().Pods(ns).Delete(t.Context(), name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	if err != nil && !isNotFound(err) {
		t.Fatal(err)
	}
}

// WaitBound waits until pod ns/name is bound to a node and returns it; on
// timeout it fails t with the pod's events.
func (e *Env) WaitBound(t testing.TB, ns, name string, timeout time.Duration) *v1.Pod {
	t.Helper()
	p, err := e.CP.WaitForPod(t.Context(), ns, name, "bound", timeout, func(p *v1.Pod) (bool, error) { return p.Spec.NodeName != "", nil })
	if err != nil {
		t.Fatalf("%v\nevents: %s\nnodes: %s", err, e.Events(t, ns, name), e.NodeTaints(t))
	}
	return p
}

// NodeTaints describes the taints of every node, for failure messages.
func (e *Env) NodeTaints(t testing.TB) string {
	nodes, err := e.Client.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	for _, n := range nodes.Items {
		fmt.Fprintf(&b, "%s %v; ", n.Name, n.Spec.Taints)
	}
	return b.String()
}

// Events returns the events of object ns/name (any kind), one per line:
// "[Type Reason] message".
func (e *Env) Events(t testing.TB, ns, name string) string {
	t.Helper()
	list, err := e.Client.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	for _, ev := range list.Items {
		fmt.Fprintf(&b, "[%s %s] %s\n", ev.Type, ev.Reason, ev.Message)
	}
	return b.String()
}

// WaitEvent waits until object ns/name has an event whose reason is
// reason and whose message contains want, and returns all its events.
func (e *Env) WaitEvent(t testing.TB, ns, name, reason, want string, timeout time.Duration) string {
	t.Helper()
	var last string
	err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		list, err := e.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
		if err != nil {
			return false, nil
		}
		var b strings.Builder
		found := false
		for _, ev := range list.Items {
			fmt.Fprintf(&b, "[%s %s] %s\n", ev.Type, ev.Reason, ev.Message)
			found = found || (ev.Reason == reason && strings.Contains(ev.Message, want))
		}
		last = b.String()
		return found, nil
	})
	if err != nil {
		t.Fatalf("%s/%s: no %s event containing %q: %v; events:\n%s", ns, name, reason, want, err, last)
	}
	return last
}

// WaitPendingWith waits until pod ns/name's FailedScheduling event or its
// PodScheduled condition (kube-scheduler writes both) contains want, and
// checks the pod is still not bound.
func (e *Env) WaitPendingWith(t testing.TB, ns, pod, want string, timeout time.Duration) {
	t.Helper()
	var last string
	err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		last = e.Events(t, ns, pod)
		if strings.Contains(last, "FailedScheduling") && strings.Contains(last, want) {
			return true, nil
		}
		p, err := e.Client.CoreV1().Pods(ns).Get(ctx, pod, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, c := range p.Status.Conditions {
			if c.Type == v1.PodScheduled && c.Status == v1.ConditionFalse {
				last += "[condition] " + c.Message + "\n"
				if strings.Contains(c.Message, want) {
					return true, nil
				}
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("pod %s: no FailedScheduling event or condition with %q: %v; saw:\n%s", pod, want, err, last)
	}
	if p := e.GetPod(t, ns, pod); p.Spec.NodeName != "" {
		t.Fatalf("pod %s is bound to %s, want Pending", pod, p.Spec.NodeName)
	}
}

// LimitOf sums resource r over the pod's containers' limits.
func LimitOf(p *v1.Pod, r v1.ResourceName) int64 {
	var n int64
	for _, c := range p.Spec.Containers {
		if q, ok := c.Resources.Limits[r]; ok {
			n += q.Value()
		}
	}
	return n
}

// WholeGPUs is the pod's tessera.dev/gpu.
func WholeGPUs(p *v1.Pod) int { return int(LimitOf(p, api.ResourceGPU)) }

// SharedAssignment is an assignment of a slice of GPU gpu of node to
// container "main".
func SharedAssignment(node string, gpu int, memMiB, cores int64) *api.Assignment {
	a := api.NewAssignment()
	a.Containers = append(a.Containers, api.ContainerAssignment{Name: "main",
		Shared: &api.SharedGPU{GPU: api.GPURef{UUID: GPUUUID(node, gpu), Index: gpu}, MemoryMiB: memMiB, Cores: cores}})
	return a
}

// WholeAssignment is an assignment of GPUs gpus of node to container
// "main".
func WholeAssignment(node string, gpus ...int) *api.Assignment {
	a := api.NewAssignment()
	var refs []api.GPURef
	for _, g := range gpus {
		refs = append(refs, api.GPURef{UUID: GPUUUID(node, g), Index: g})
	}
	a.Containers = append(a.Containers, api.ContainerAssignment{Name: "main", GPUs: refs})
	return a
}
