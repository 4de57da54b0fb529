package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// What HAMi (github.com/Project-HAMi/HAMi v2.10.0) reads and writes, as its
// source and chart document them: the resource names of its chart's
// defaults, the node annotations its NVIDIA device plugin writes
// (pkg/device-plugin/.../register.go) and its scheduler reads
// (pkg/device/nvidia/device.go), the node lock its extender's bind sets
// and its device plugin's Allocate releases (pkg/util/nodelock), and the
// pod annotation of the bind phase (pkg/util/types.go).
const (
	hamiResourceGPU         = "nvidia.com/gpu"
	hamiResourceMem         = "nvidia.com/gpumem" // MiB
	hamiResourceCores       = "nvidia.com/gpucores"
	hamiResourceMemPercent  = "nvidia.com/gpumem-percentage"
	hamiResourcePriority    = "nvidia.com/priority"
	hamiAnnotationRegister  = "hami.io/node-nvidia-register"
	hamiAnnotationNodeLock  = "hami.io/mutex.lock"
	hamiAnnotationBindPhase = "hami.io/bind-phase"
	hamiBindAllocating      = "allocating"
	hamiBindSuccess         = "success"
	// hamiSplitCount is the chart's devicePlugin.deviceSplitCount: each GPU
	// is offered to at most this many pods, and the device plugin registers
	// GPUs x splitCount of nvidia.com/gpu with the kubelet.
	hamiSplitCount = 10
	hamiUser       = "hami-scheduler"
)

// hamiDevice is one entry of the hami.io/node-nvidia-register annotation
// (the JSON of HAMi's device.DeviceInfo).
type hamiDevice struct {
	ID      string `json:"id,omitempty"`
	Index   uint   `json:"index,omitempty"`
	Count   int32  `json:"count,omitempty"`
	Devmem  int32  `json:"devmem,omitempty"`
	Devcore int32  `json:"devcore,omitempty"`
	Type    string `json:"type,omitempty"`
	Numa    int    `json:"numa,omitempty"`
	Mode    string `json:"mode,omitempty"`
	Health  bool   `json:"health,omitempty"`
}

// hamiRegister is the register annotation HAMi's device plugin would write
// for the benchmark's 8-GPU node: the same GPUs (UUIDs, memory, NUMA) as
// Tessera's inventory annotation.
func hamiRegister(node string) (string, error) {
	return hamiRegisterOf(node, benchShape)
}

// hamiRegisterOf is hamiRegister for a node of shape s.
func hamiRegisterOf(node string, s nodeShape) (string, error) {
	devs := make([]hamiDevice, s.gpus)
	for i := range devs {
		devs[i] = hamiDevice{ID: gpuUUID(node, i), Index: uint(i), Count: hamiSplitCount, Devmem: int32(s.gpuMemMiB), Devcore: 100,
			Type: s.model, Numa: i * 2 / s.gpus, Mode: "hami-core", Health: true}
	}
	b, err := json.Marshal(devs)
	if err != nil {
		return "", fmt.Errorf("HAMi register annotation: %w", err)
	}
	return string(b), nil
}

// peerNode is fakeNode plus what HAMi's device plugin would add: the
// register annotation and nvidia.com/gpu (GPUs x split count) in capacity.
// The other systems ignore both (HAMi's own scheduler config marks
// nvidia.com/gpu ignoredByScheduler, so only HAMi counts it).
func peerNode(name string) (*v1.Node, error) {
	return peerNodeOf(name, benchShape)
}

// peerNodeOf is peerNode for a node of shape s.
func peerNodeOf(name string, s nodeShape) (*v1.Node, error) {
	n, err := fakeNodeOf(name, s)
	if err != nil || s.gpus == 0 {
		return n, err
	}
	reg, err := hamiRegisterOf(name, s)
	if err != nil {
		return nil, err
	}
	n.Annotations[hamiAnnotationRegister] = reg
	q := *resource.NewQuantity(int64(s.gpus*hamiSplitCount), resource.DecimalSI)
	n.Status.Capacity[hamiResourceGPU] = q
	n.Status.Allocatable[hamiResourceGPU] = q
	return n, nil
}

// hamiDeviceConfig is the nvidia part of the chart's device-config.yaml
// with its default values (HAMi's scheduler fails without a device
// config file).
const hamiDeviceConfig = `nvidia:
  resourceCountName: nvidia.com/gpu
  resourceMemoryName: nvidia.com/gpumem
  resourceMemoryPercentageName: nvidia.com/gpumem-percentage
  resourceCoreName: nvidia.com/gpucores
  resourcePriorityName: nvidia.com/priority
  overwriteEnv: false
  defaultMemory: 0
  defaultCores: 0
  defaultGPUNum: 1
  memoryFactor: 1
  deviceSplitCount: 10
  deviceMemoryScaling: 1
  deviceCoreScaling: 1
`

// hamiSchedulerConfig is the KubeSchedulerConfiguration of HAMi's chart
// (templates/scheduler/configmap.yaml, without the admission webhook):
// one profile and HAMi's extender for filter and bind, node names only,
// its resources ignored by kube-scheduler, pointed at url.
func hamiSchedulerConfig(url, profile string) string {
	var b strings.Builder
	fmt.Fprintf(&b, `apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
profiles:
- schedulerName: %s
extenders:
- urlPrefix: %s
  enableHTTPS: false
  filterVerb: filter
  bindVerb: bind
  nodeCacheCapable: true
  weight: 1
  httpTimeout: 30s
  managedResources:
`, profile, url)
	for _, r := range []string{hamiResourceGPU, hamiResourceMem, hamiResourceCores, hamiResourceMemPercent, hamiResourcePriority} {
		fmt.Fprintf(&b, "  - {name: %s, ignoredByScheduler: true}\n", r)
	}
	return b.String()
}

// setupHAMiAccess gives hamiUser the rules of HAMi's chart
// (templates/scheduler/clusterrole.yaml) and writes its kubeconfig.
func setupHAMiAccess(ctx context.Context, client kubernetes.Interface, kubeconfigFor func(user, file string) (string, error)) (string, error) {
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "bench-hami-scheduler"},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"pods", "configmaps"}, Verbs: []string{"get", "list", "watch", "patch"}},
			{APIGroups: []string{""}, Resources: []string{"pods/binding"}, Verbs: []string{"create"}},
			{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list", "patch", "watch"}},
			{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "get", "list"}},
			{APIGroups: []string{""}, Resources: []string{"resourcequotas"}, Verbs: []string{"get", "list", "watch"}},
		},
	}
	if err := createRoleFor(ctx, client, role, hamiUser); err != nil {
		return "", err
	}
	return kubeconfigFor(hamiUser, "hami.kubeconfig")
}

// createRoleFor creates role and binds it to user.
func createRoleFor(ctx context.Context, client kubernetes.Interface, role *rbacv1.ClusterRole, user string) error {
	if _, err := client.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create ClusterRole %s: %w", role.Name, err)
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role.Name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: user}},
	}
	if _, err := client.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create ClusterRoleBinding %s: %w", binding.Name, err)
	}
	return nil
}

// startHAMi runs HAMi's scheduler extender as its own process: chart
// defaults, except the API client limits, raised to tessera-extender's
// (100 QPS, burst 200; HAMi's default is client-go's 5 and 10), and
// loopback addresses.
func startHAMi(ctx context.Context, bin, kubeconfig, addr, dir string, timeout time.Duration) (*extenderProc, error) {
	cfg := filepath.Join(dir, "hami-device-config.yaml")
	if err := os.WriteFile(cfg, []byte(hamiDeviceConfig), 0o600); err != nil {
		return nil, fmt.Errorf("write HAMi device config: %w", err)
	}
	metrics, err := freeAddr()
	if err != nil {
		return nil, err
	}
	args := []string{
		"--http_bind=" + addr,
		"--metrics-bind-address=" + metrics,
		"--device-config-file=" + cfg,
		"--scheduler-name=hami-scheduler",
		"--node-scheduler-policy=binpack",
		"--gpu-scheduler-policy=spread",
		"--kube-qps=100",
		"--kube-burst=200",
	}
	p, err := startProc(ctx, bin, args, []string{"KUBECONFIG=" + kubeconfig}, filepath.Join(dir, "hami-scheduler.log"), "http://"+addr+"/healthz", timeout)
	if err != nil {
		return nil, err
	}
	p.addr = addr
	return p, nil
}

// waitHAMiRegistered waits until HAMi has handshaken every node of the
// cluster (its registration pass writes hami.io/node-handshake on each
// node it took in), at most timeout.
func waitHAMiRegistered(ctx context.Context, client kubernetes.Interface, nodes int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		list, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{ResourceVersion: "0"})
		if err != nil {
			return fmt.Errorf("list nodes: %w", err)
		}
		done := 0
		for _, n := range list.Items {
			if strings.HasPrefix(n.Annotations["hami.io/node-handshake"], "Requesting_") {
				done++
			}
		}
		if done >= nodes {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("HAMi registered %d of %d nodes within %s", done, nodes, timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// hamiNodeAgent stands in for what HAMi's device plugin does once the
// kubelet admits a pod HAMi bound (its Allocate): mark the pod's bind
// phase "success" and release the node lock HAMi's bind took. There is no
// kubelet here; without this every node would stay locked for HAMi's
// --node-lock-timeout (5 min) after its first GPU pod, and HAMi's bind
// refuses a locked node.
type hamiNodeAgent struct {
	*podStandIn[types.NamespacedName]
	client kubernetes.Interface
	ns     string

	mu       sync.Mutex
	released int
}

func startHAMiNodeAgent(ctx context.Context, client kubernetes.Interface, ns string, workers int) (*hamiNodeAgent, error) {
	a := &hamiNodeAgent{podStandIn: newPodStandIn[types.NamespacedName](client, ns), client: client, ns: ns}
	allocating := func(p *v1.Pod) (types.NamespacedName, bool) {
		return types.NamespacedName{Namespace: p.Namespace, Name: p.Name}, p.Spec.NodeName != "" && p.Annotations[hamiAnnotationBindPhase] == hamiBindAllocating
	}
	lister := a.factory.Core().V1().Pods().Lister()
	allocate := func(ctx context.Context, key types.NamespacedName) error {
		return a.allocate(ctx, lister.Pods(key.Namespace), key)
	}
	if err := a.run(ctx, "HAMi node agent", allocating, allocate, workers, 5); err != nil {
		return nil, err
	}
	return a, nil
}

type podGetter interface {
	Get(name string) (*v1.Pod, error)
}

func (a *hamiNodeAgent) allocate(ctx context.Context, pods podGetter, key types.NamespacedName) error {
	p, err := pods.Get(key.Name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("get pod %s: %w", key, err)
	}
	if p.Annotations[hamiAnnotationBindPhase] != hamiBindAllocating || p.Spec.NodeName == "" {
		return nil
	}
	patch := fmt.Appendf(nil, `{"metadata":{"annotations":{%q:%q}}}`, hamiAnnotationBindPhase, hamiBindSuccess)
	if _, err := a.client.CoreV1().Pods(p.Namespace).Patch(ctx, p.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("patch bind phase of %s: %w", key, err)
	}
	node, err := a.client.CoreV1().Nodes().Get(ctx, p.Spec.NodeName, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("get node %s: %w", p.Spec.NodeName, err)
	}
	lock, ok := node.Annotations[hamiAnnotationNodeLock]
	if !ok || !strings.HasSuffix(lock, ","+p.Namespace+","+p.Name) {
		return nil // not this pod's lock (any more)
	}
	unlock := fmt.Appendf(nil, `{"metadata":{"annotations":{%q:null},"resourceVersion":%q}}`, hamiAnnotationNodeLock, node.ResourceVersion)
	if _, err := a.client.CoreV1().Nodes().Patch(ctx, node.Name, types.MergePatchType, unlock, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("release node lock of %s: %w", node.Name, err)
	}
	a.mu.Lock()
	a.released++
	a.mu.Unlock()
	return nil
}

func (a *hamiNodeAgent) stop() {
	if a != nil {
		a.podStandIn.stop()
	}
}

func (a *hamiNodeAgent) counts() (released, failures int, lastErr error) {
	failures, lastErr = a.failed()
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.released, failures, lastErr
}

func hamiPod(ns, schedulerName, run string, i int, s shape) *v1.Pod {
	limits := v1.ResourceList{}
	set := func(r v1.ResourceName, v int64) {
		if v > 0 {
			limits[r] = *resource.NewQuantity(v, resource.DecimalSI)
		}
	}
	if s.gpus > 0 {
		set(hamiResourceGPU, s.gpus)
	} else {
		set(hamiResourceGPU, 1)
		set(hamiResourceMem, s.memUnits*memUnitMiB)
		set(hamiResourceCores, s.cores)
	}
	return podWithLimits(ns, schedulerName, run, i, s.name, limits)
}

// podWithLimits is the benchmark's pod (as benchPod) with limits.
func podWithLimits(ns, schedulerName, run string, i int, shapeName string, limits v1.ResourceList) *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%05d-%s", run, i, shapeName), Namespace: ns,
			Labels: map[string]string{runLabel: run, "bench.tessera.dev/shape": shapeName}},
		Spec: v1.PodSpec{
			SchedulerName: schedulerName,
			Containers: []v1.Container{{Name: "main", Image: "registry.k8s.io/pause:3.10",
				Resources: v1.ResourceRequirements{Limits: limits, Requests: v1.ResourceList{
					v1.ResourceCPU: resource.MustParse("100m"), v1.ResourceMemory: resource.MustParse("128Mi")}}}},
		},
	}
}
