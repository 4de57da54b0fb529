package e2e

import (
	"context"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/cpuset"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/gpu/nvmlmock"
	"github.com/tessera-gpu/tessera/test/framework/nodesim"
)

var gpuDevice = regexp.MustCompile(`^/dev/nvidia[0-9]+$`)

// profileOf returns the mock machine profile of a node of the cluster.
func profileOf(t *testing.T, c *nodesim.Cluster, node string) string {
	t.Helper()
	for _, n := range c.Nodes() {
		if n.Name == node {
			return n.Profile
		}
	}
	t.Fatalf("node %s is not in the cluster", node)
	return ""
}

// numaCPUs returns the CPUs of a NUMA node of a profile.
func numaCPUs(t *testing.T, profile string, numa int) cpuset.CPUSet {
	t.Helper()
	m, err := nvmlmock.Load(profile)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range m.NUMANodes {
		if n.ID == numa {
			s, err := cpuset.Parse(n.CPUs)
			if err != nil {
				t.Fatal(err)
			}
			return s
		}
	}
	t.Fatalf("profile %s has no NUMA node %d", profile, numa)
	return cpuset.New()
}

// checkIsolated checks what one container of a running pod received from
// the device plugin and the NRI plugin against its assignment: only its
// GPUs (environment, device nodes, device cgroup), its limits when shared,
// and a cpuset on its GPUs' NUMA nodes.
func checkIsolated(t *testing.T, c *nodesim.Cluster, p *v1.Pod, rec *nodesim.PodRecord, container string) {
	t.Helper()
	cr := rec.Container(container)
	if cr == nil {
		t.Errorf("pod %s: node record has no container %s", p.Name, container)
		return
	}
	// The node agent records whole GPUs on the pod after the kubelet
	// allocated them (asynchronously): wait for it.
	p, ca := waitAssignment(t, c, p, container, len(cr.Allocated[string(api.ResourceGPU)]))
	if ca == nil {
		return
	}
	if ca.Shared == nil {
		var uuids []string
		for _, g := range ca.GPUs {
			uuids = append(uuids, g.UUID)
		}
		slices.Sort(uuids)
		if !slices.Equal(uuids, cr.Allocated[string(api.ResourceGPU)]) {
			t.Errorf("pod %s container %s: assignment GPUs %v, the kubelet allocated %v", p.Name, container, uuids, cr.Allocated[string(api.ResourceGPU)])
		}
	}
	if !cr.Adjusted {
		t.Errorf("pod %s container %s: not adjusted by the NRI plugin: %s", p.Name, container, nodesim.RecordJSON(rec))
		return
	}
	var gpus []api.GPURef
	if ca.Shared != nil {
		gpus = ca.Shared.GPUs()
	} else {
		gpus = ca.GPUs
	}
	if len(gpus) == 0 {
		t.Errorf("pod %s container %s: assignment names no GPU: %+v", p.Name, container, ca)
		return
	}
	inv := inventory(t, c, p.Spec.NodeName)
	uuids := ""
	wantCPUs := cpuset.New()
	for i, g := range gpus {
		if i > 0 {
			uuids += ","
		}
		uuids += g.UUID
		if g.Index < 0 || g.Index >= len(inv.GPUs) || inv.GPUs[g.Index].UUID != g.UUID {
			t.Errorf("pod %s container %s: assigned GPU %+v is not GPU %d of node %s", p.Name, container, g, g.Index, p.Spec.NodeName)
			continue
		}
		wantCPUs = wantCPUs.Union(numaCPUs(t, profileOf(t, c, p.Spec.NodeName), inv.GPUs[g.Index].NUMANode))
	}
	if got := cr.Env["NVIDIA_VISIBLE_DEVICES"]; got != uuids {
		t.Errorf("pod %s container %s: NVIDIA_VISIBLE_DEVICES=%q, want %q", p.Name, container, got, uuids)
	}
	// The GPUs reach the container as device nodes or CDI devices (per the
	// device list strategy): exactly its own.
	var devs []string
	for _, d := range cr.Devices {
		if gpuDevice.MatchString(d) {
			devs = append(devs, d)
		}
	}
	cdi := map[string]bool{}
	for _, d := range cr.CDIDevices {
		if u, ok := strings.CutPrefix(d, "nvidia.com/gpu="); ok {
			cdi[u] = true
		}
	}
	if len(devs) > 0 && len(devs) != len(gpus) {
		t.Errorf("pod %s container %s: GPU device nodes %v, want %d", p.Name, container, devs, len(gpus))
	}
	if len(devs) == 0 {
		want := map[string]bool{}
		for _, g := range gpus {
			want[g.UUID] = true
		}
		if !maps.Equal(cdi, want) {
			t.Errorf("pod %s container %s: CDI GPUs %v, want %v (all devices %v)", p.Name, container, cdi, want, cr.CDIDevices)
		}
	}
	allowed := 0
	for _, r := range cr.CgroupRules {
		var verb, typ, access string
		var major int
		var minor string
		if _, err := fmt.Sscanf(r, "%s %s %d:%s %s", &verb, &typ, &major, &minor, &access); err != nil {
			continue
		}
		if verb == "allow" && major == 195 && minor != "255" && minor != "*" {
			allowed++
		}
	}
	if allowed != len(gpus) {
		t.Errorf("pod %s container %s: device cgroup allows %d GPUs, want %d: %v", p.Name, container, allowed, len(gpus), cr.CgroupRules)
	}
	got, err := cpuset.Parse(cr.CPUs)
	if err != nil || !got.Equals(wantCPUs) {
		t.Errorf("pod %s container %s: cpuset %q, want the CPUs of its GPUs' NUMA nodes %q", p.Name, container, cr.CPUs, wantCPUs.String())
	}
	if ca.Shared != nil {
		// One memory limit per device ordinal: a multi-GPU slice's GPUs
		// are ordinals 0..N-1 of its MPS daemon.
		var limits []string
		for i := range gpus {
			limits = append(limits, fmt.Sprintf("%d=%dM", i, ca.Shared.MemoryMiB))
		}
		want := map[string]string{
			"TESSERA_GPU_SHARED":                "true",
			"TESSERA_GPU_MEMORY_LIMIT_MIB":      strconv.FormatInt(ca.Shared.MemoryMiB, 10),
			"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT":  strings.Join(limits, ","),
			"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": strconv.FormatInt(ca.Shared.Cores, 10),
		}
		for k, v := range want {
			if cr.Env[k] != v {
				t.Errorf("pod %s container %s: %s=%q, want %q", p.Name, container, k, cr.Env[k], v)
			}
		}
		if len(cr.Mounts) == 0 {
			t.Errorf("pod %s container %s: no MPS pipe mount", p.Name, container)
		}
	} else if cr.Env["TESSERA_GPU_SHARED"] != "false" {
		t.Errorf("pod %s container %s: TESSERA_GPU_SHARED=%q, want false", p.Name, container, cr.Env["TESSERA_GPU_SHARED"])
	}
}

// A shared pod's containers receive only their GPU, with the memory and
// core limits of their slice, and cpusets on that GPU's NUMA node.
func TestSharedPodIsolated(t *testing.T) {
	c := getCluster(t)
	ns := namespace(t, c, "e2e-shared")
	create(t, c.Client(), ns, podSpec{name: "infer", memUnits: 4, cores: 20, containers: 2})
	p, rec := waitRunning(t, c, ns, "infer", 60*time.Second)
	a, _, err := api.GetAssignment(p.Annotations)
	if err != nil {
		t.Fatal(err)
	}
	for _, ctr := range []string{"main", "side1"} {
		ca := a.Container(ctr)
		if ca == nil || ca.Shared == nil {
			t.Fatalf("container %s has no shared slice: %+v", ctr, a)
		}
		if ca.Shared.MemoryMiB != 4*1024 || ca.Shared.Cores != 20 {
			t.Errorf("container %s slice %+v, want 4096 MiB and 20 cores", ctr, ca.Shared)
		}
		checkIsolated(t, c, p, rec, ctr)
	}
}

// waitAssignment waits up to 30s until the pod's assignment has an entry
// for container with wholeGPUs whole GPUs (0: a shared slice), and returns
// the pod read then and the entry (nil after an error reported on t).
func waitAssignment(t *testing.T, c *nodesim.Cluster, p *v1.Pod, container string, wholeGPUs int) (*v1.Pod, *api.ContainerAssignment) {
	t.Helper()
	var ca *api.ContainerAssignment
	var last error
	err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		a, ok, err := api.GetAssignment(p.Annotations)
		if ok && err == nil {
			if ca = a.Container(container); ca != nil && (ca.Shared != nil || len(ca.GPUs) == wholeGPUs) {
				return true, nil
			}
		}
		last = err
		fresh, err := c.Client().CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
		if err != nil || fresh.UID != p.UID {
			return false, fmt.Errorf("pod gone: %v", err)
		}
		p = fresh
		return false, nil
	})
	if err != nil {
		t.Errorf("pod %s/%s container %s: no assignment with %d whole GPUs or a slice (%v, last error %v): %v", p.Namespace, p.Name, container, wholeGPUs, err, last, p.Annotations[api.AnnotationAssignment])
		return p, nil
	}
	return p, ca
}

// A container the NRI plugin refuses (whole GPUs and shared units at once:
// an MPS client sees only its server's GPU) never runs: the node fails the
// pod with the runtime's CreateContainerError and the plugin's reason, as
// the kubelet reports a container that cannot be created. The pod bypasses
// the scheduler (spec.nodeName), so only the node can refuse it.
func TestNodeFailsPodNRIRefuses(t *testing.T) {
	c := getCluster(t)
	ns := namespace(t, c, "e2e-refused")
	s := podSpec{name: "mixed", gpus: 1, memUnits: 2, cores: 10}
	p := s.pod(ns)
	p.Spec.NodeName = "l40s-1"
	if _, err := c.Client().CoreV1().Pods(ns).Create(t.Context(), p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var got *v1.Pod
	err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		var err error
		if got, err = c.Client().CoreV1().Pods(ns).Get(ctx, "mixed", metav1.GetOptions{}); err != nil {
			return false, nil
		}
		if got.Status.Phase == v1.PodRunning {
			return false, fmt.Errorf("the pod runs")
		}
		return got.Status.Phase == v1.PodFailed, nil
	})
	if err != nil {
		t.Fatalf("pod with whole GPUs and shared units in one container: want Failed: %v\n%s", err, describe(t, c, got))
	}
	if got.Status.Reason != "CreateContainerError" || !strings.Contains(got.Status.Message, "whole") {
		t.Errorf("Failed with %s: %s; want CreateContainerError with the NRI plugin's reason", got.Status.Reason, got.Status.Message)
	}
	rec, err := c.Record(got)
	if err != nil || rec == nil || rec.Phase != string(v1.PodFailed) {
		t.Errorf("node record: %+v (%v); want Failed", rec, err)
	}
}

// A container that holds no Tessera GPU sees none, whatever its spec asks
// for: a pod without GPU requests and a GPU pod's sidecar both set
// NVIDIA_VISIBLE_DEVICES=all and end with void, the NVIDIA devices denied
// (NVIDIA/k8s-device-plugin#61); the sidecar's GPU container keeps its GPU.
// The sidecar sets it from a ConfigMap (envFrom), as the kubelet resolves
// it before the runtime sees the container.
func TestContainerWithoutGPUSeesNone(t *testing.T) {
	c := getCluster(t)
	ns := namespace(t, c, "e2e-nogpu")
	all := []v1.EnvVar{{Name: api.EnvNVIDIAVisibleDevices, Value: "all"}}
	plain := podSpec{name: "plain"}.pod(ns)
	plain.Spec.Containers[0].Env = all
	cm := &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "visible"}, Data: map[string]string{api.EnvNVIDIAVisibleDevices: "all"}}
	if _, err := c.Client().CoreV1().ConfigMaps(ns).Create(t.Context(), cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	gpu := podSpec{name: "gpu", gpus: 1}.pod(ns)
	gpu.Spec.Containers = append(gpu.Spec.Containers, v1.Container{Name: "sidecar", Image: "registry.k8s.io/pause:3.10",
		EnvFrom: []v1.EnvFromSource{{ConfigMapRef: &v1.ConfigMapEnvSource{LocalObjectReference: v1.LocalObjectReference{Name: cm.Name}}}}})
	for _, p := range []*v1.Pod{plain, gpu} {
		if _, err := c.Client().CoreV1().Pods(ns).Create(t.Context(), p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct{ pod, container string }{{"plain", "main"}, {"gpu", "sidecar"}} {
		_, rec := waitRunning(t, c, ns, tc.pod, 60*time.Second)
		cr := rec.Container(tc.container)
		if cr == nil {
			t.Fatalf("pod %s: node record has no container %s", tc.pod, tc.container)
		}
		if got := cr.Env[api.EnvNVIDIAVisibleDevices]; got != "void" {
			t.Errorf("pod %s container %s: %s=%q, want void", tc.pod, tc.container, api.EnvNVIDIAVisibleDevices, got)
		}
		if !slices.Contains(cr.CgroupRules, "deny c 195:* rwm") || slices.ContainsFunc(cr.CgroupRules, func(r string) bool { return strings.HasPrefix(r, "allow") }) {
			t.Errorf("pod %s container %s: device cgroup rules %v, want NVIDIA devices denied and nothing allowed", tc.pod, tc.container, cr.CgroupRules)
		}
		if len(cr.Devices) > 0 || len(cr.CDIDevices) > 0 {
			t.Errorf("pod %s container %s: given devices %v, CDI devices %v", tc.pod, tc.container, cr.Devices, cr.CDIDevices)
		}
	}
	p, rec := waitRunning(t, c, ns, "gpu", 60*time.Second)
	checkIsolated(t, c, p, rec, "main")
}
