// Package e2e runs Tessera end to end on a local cluster without GPUs: a
// real control plane (etcd, kube-apiserver, kube-scheduler with deploy/'s
// extender configuration), tessera-extender as its own process, and
// simulated GPU nodes (package nodesim: the kubelet's real device manager,
// containerd's NRI runtime side and the real tessera-node on mock
// machines), every one its own process.
package e2e

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/test/framework/nodesim"
)

var (
	cluster    *nodesim.Cluster
	clusterErr error
	once       sync.Once
)

// binDir holds the binaries the tests built.
var binDir string

func TestMain(m *testing.M) {
	code := m.Run()
	if cluster != nil {
		if code != 0 || os.Getenv("TESSERA_TEST_KEEP_LOGS") != "" {
			keepLogs()
		}
		cluster.Stop()
	}
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// keepLogs copies the cluster's logs to $TESSERA_TEST_ARTIFACTS/e2e (or a
// temporary directory) when a test failed, or always with
// $TESSERA_TEST_KEEP_LOGS set.
func keepLogs() {
	dst := os.Getenv("TESSERA_TEST_ARTIFACTS")
	if dst == "" {
		dst = os.TempDir()
	}
	dst = filepath.Join(dst, "tessera-e2e-logs")
	_ = os.MkdirAll(dst, 0o755)
	for name, src := range cluster.LogFiles() {
		if b, err := os.ReadFile(src); err == nil {
			_ = os.WriteFile(filepath.Join(dst, name+".log"), b, 0o644)
		}
	}
	fmt.Fprintf(os.Stderr, "e2e: component logs copied to %s\n", dst)
}

func repoRoot() string {
	wd, _ := os.Getwd()
	return filepath.Clean(filepath.Join(wd, "..", ".."))
}

var (
	buildOnce sync.Once
	bins      [3]string
	buildErr  error
)

// binaries builds the three binaries once per test binary: the node
// simulator, tessera-node and tessera-extender.
func binaries() (nodesimBin, agentBin, extenderBin string, err error) {
	buildOnce.Do(func() { bins[0], bins[1], bins[2], buildErr = build() })
	return bins[0], bins[1], bins[2], buildErr
}

// build builds the three binaries (go's build cache makes this quick after
// the first time).
func build() (nodesimBin, agentBin, extenderBin string, err error) {
	dir, err := os.MkdirTemp("", "tessera-e2e-bin-")
	if err != nil {
		return "", "", "", err
	}
	binDir = dir
	root := repoRoot()
	for _, b := range []struct{ dir, pkg, out string }{
		{filepath.Join(root, "test"), "./cmd/tessera-nodesim", "tessera-nodesim"},
		{root, "./cmd/tessera-node", "tessera-node"},
		{root, "./cmd/tessera-extender", "tessera-extender"},
	} {
		cmd := exec.Command("go", "build", "-o", filepath.Join(dir, b.out), b.pkg)
		cmd.Dir = b.dir
		if out, err := cmd.CombinedOutput(); err != nil {
			return "", "", "", fmt.Errorf("go build %s: %w\n%s", b.pkg, err, out)
		}
	}
	return filepath.Join(dir, "tessera-nodesim"), filepath.Join(dir, "tessera-node"), filepath.Join(dir, "tessera-extender"), nil
}

// getCluster starts the shared cluster on first use: the default four
// nodes (two dgx-a100, one dgx-1v, one pcie-2numa).
func getCluster(t *testing.T) *nodesim.Cluster {
	t.Helper()
	once.Do(func() {
		start := time.Now()
		ns, ag, ext, err := binaries()
		if err != nil {
			clusterErr = err
			return
		}
		t.Logf("binaries built in %s", time.Since(start).Round(time.Millisecond))
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		cluster, clusterErr = nodesim.StartCluster(ctx, nodesim.ClusterOptions{
			NodeSim: ns, Agent: ag, Extender: ext, RepoRoot: repoRoot(),
			// The demo's flags: reservations after 10 s (TestReservation...).
			ExtenderArgs: nodesim.LocalExtenderArgs(),
			// As make demo's cluster: Deployments, Jobs, ServiceAccounts.
			ControllerManager: true,
			VolcanoCRD:        true,
			Logf:              func(f string, a ...any) { t.Logf(f, a...) },
		})
		if clusterErr == nil {
			t.Logf("cluster up in %s (dir %s)", time.Since(start).Round(time.Millisecond), cluster.Dir)
		}
	})
	if clusterErr != nil {
		t.Fatalf("local cluster: %v", clusterErr)
	}
	return cluster
}

// ownCluster starts a cluster of the test's own (nodes, extender args) with
// namespace ns, within ctx; it is stopped when t ends, after naming its
// logs when t failed.
func ownCluster(ctx context.Context, t *testing.T, ns string, nodes []nodesim.NodeSpec, extenderArgs ...string) *nodesim.Cluster {
	t.Helper()
	nsBin, agent, ext, err := binaries()
	if err != nil {
		t.Fatal(err)
	}
	c, err := nodesim.StartCluster(ctx, nodesim.ClusterOptions{
		NodeSim: nsBin, Agent: agent, Extender: ext, RepoRoot: repoRoot(),
		Nodes: nodes, ExtenderArgs: extenderArgs, ControllerManager: true,
		Logf: func(f string, a ...any) { t.Logf(f, a...) },
	})
	if err != nil {
		t.Fatalf("cluster of %s: %v", t.Name(), err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			keepFailedLogs(t, c.LogFiles(), 0)
		}
		c.Stop()
	})
	if err := c.EnsureNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	return c
}

// keepFailedLogs copies a failed test's logs (name -> path) to
// $TESSERA_TEST_ARTIFACTS/<test>/ (or the temporary directory), where they
// outlive the cluster's directory, and prints their paths with the last
// tail bytes of each.
func keepFailedLogs(t *testing.T, logs map[string]string, tail int) {
	dst := filepath.Join(cmp.Or(os.Getenv("TESSERA_TEST_ARTIFACTS"), os.TempDir()), t.Name())
	_ = os.MkdirAll(dst, 0o755)
	names := slices.Sorted(maps.Keys(logs))
	for _, name := range names {
		b, _ := os.ReadFile(logs[name])
		kept := filepath.Join(dst, name+".log")
		_ = os.WriteFile(kept, b, 0o644)
		if tail <= 0 {
			t.Logf("log %s: %s", name, kept)
			continue
		}
		if len(b) > tail {
			b = b[len(b)-tail:]
		}
		t.Logf("log %s (whole: %s), its end:\n%s", name, kept, b)
	}
}

// dynamicClient is c's dynamic client (Queues, ElasticQuotas, PodGroups);
// the test stops when it cannot be made.
func dynamicClient(t *testing.T, c *nodesim.Cluster) dynamic.Interface {
	t.Helper()
	dyn, err := c.Dynamic()
	if err != nil {
		t.Fatal(err)
	}
	return dyn
}

func namespace(t *testing.T, c *nodesim.Cluster, name string) string {
	t.Helper()
	if err := c.EnsureNamespace(t.Context(), name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteAll(t, c, name) })
	return name
}

// deleteAll deletes the namespace's pods and waits until they are gone
// (the node simulators confirm deletions once the pods are stopped).
func deleteAll(t *testing.T, c *nodesim.Cluster, ns string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	client := c.Client()
	if err := client.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		t.Errorf("delete pods of %s: %v", ns, err)
		return
	}
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		l, err := client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		return len(l.Items) == 0, nil
	})
	if err != nil {
		t.Errorf("pods of %s not gone: %v", ns, err)
		return
	}
	waitReleased(t, c)
}

// waitReleased waits until every node that runs no pod advertises all
// its devices as allocatable again, so that the next test does not place
// pods on GPUs a node still withholds. A node agent learns that the
// kubelet freed a whole GPU's (or a shared GPU's) devices only when it
// next reads the kubelet's allocations (when a pod of its node ends, and
// every kubeletSyncInterval, 2s by default); until then it withholds the
// other resource of that GPU (docs/demo.md). Nodes that still run pods (of a test's other namespaces)
// are left alone: their devices are legitimately in use.
func waitReleased(t *testing.T, c *nodesim.Cluster) {
	var last string
	// Up to the agent's allocationGrace (2m) plus a sync: units the agent
	// allocated for a pod the kubelet then refused count as used that long.
	err := wait.PollUntilContextTimeout(context.Background(), 250*time.Millisecond, 150*time.Second, true, func(ctx context.Context) (bool, error) {
		pods, err := c.Client().CoreV1().Pods("").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		busy := map[string]bool{}
		for _, p := range pods.Items {
			if p.Spec.NodeName != "" {
				busy[p.Spec.NodeName] = true
			}
		}
		nodes, err := c.Client().CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		for _, n := range nodes.Items {
			if busy[n.Name] {
				continue
			}
			for _, r := range []v1.ResourceName{api.ResourceGPU, api.ResourceGPUMemory, api.ResourceGPUCore} {
				ca, al := n.Status.Capacity[r], n.Status.Allocatable[r]
				if ca.Cmp(al) != 0 {
					last = fmt.Sprintf("node %s %s: allocatable %s of %s", n.Name, r, al.String(), ca.String())
					return false, nil
				}
			}
		}
		return true, nil
	})
	if err != nil {
		t.Errorf("nodes did not release every device: %v (%s)", err, last)
	}
}

type podSpec struct {
	name        string
	gpus        int64 // whole GPUs
	memUnits    int64 // tessera.dev/gpu-memory (GiB)
	cores       int64 // tessera.dev/gpu-core
	containers  int   // containers (each with the same request); default 1
	annotations map[string]string
	labels      map[string]string
	gated       bool
	cpu         string
	node        string // kubernetes.io/hostname of the node it must run on
}

func (s podSpec) pod(ns string) *v1.Pod {
	rl := v1.ResourceList{}
	if s.gpus > 0 {
		rl[api.ResourceGPU] = *resource.NewQuantity(s.gpus, resource.DecimalSI)
	}
	if s.memUnits > 0 {
		rl[api.ResourceGPUMemory] = *resource.NewQuantity(s.memUnits, resource.DecimalSI)
	}
	if s.cores > 0 {
		rl[api.ResourceGPUCore] = *resource.NewQuantity(s.cores, resource.DecimalSI)
	}
	cpu := s.cpu
	if cpu == "" {
		cpu = "100m"
	}
	n := s.containers
	if n == 0 {
		n = 1
	}
	p := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: s.name, Namespace: ns, Annotations: s.annotations, Labels: s.labels},
		Spec: v1.PodSpec{
			TerminationGracePeriodSeconds: new(int64),
		},
	}
	for i := 0; i < n; i++ {
		name := "main"
		if i > 0 {
			name = fmt.Sprintf("side%d", i)
		}
		p.Spec.Containers = append(p.Spec.Containers, v1.Container{Name: name, Image: "registry.k8s.io/pause:3.10",
			Resources: v1.ResourceRequirements{Limits: rl.DeepCopy(), Requests: v1.ResourceList{v1.ResourceCPU: resource.MustParse(cpu)}}})
	}
	if s.node != "" {
		p.Spec.NodeSelector = map[string]string{v1.LabelHostname: s.node}
	}
	if s.gated {
		p.Spec.SchedulingGates = []v1.PodSchedulingGate{{Name: api.SchedulingGateGang}}
	}
	return p
}

// onA100s restricts a pod to the cluster's two 8-GPU A100 nodes.
func onA100s(p *v1.Pod) {
	p.Spec.Affinity = &v1.Affinity{NodeAffinity: &v1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &v1.NodeSelector{
		NodeSelectorTerms: []v1.NodeSelectorTerm{{MatchExpressions: []v1.NodeSelectorRequirement{
			{Key: v1.LabelHostname, Operator: v1.NodeSelectorOpIn, Values: []string{"a100-1", "a100-2"}},
		}}},
	}}}
}

// a100Deployment creates a Deployment of replicas pods asking what req
// asks (label app=name, PriorityClass prio when not "") on the A100 nodes,
// deleted with its pods when the test ends.
func a100Deployment(t *testing.T, client kubernetes.Interface, ns, name string, replicas int32, prio string, req podSpec) {
	t.Helper()
	t.Cleanup(func() {
		fg := metav1.DeletePropagationForeground
		_ = client.AppsV1().Deployments(ns).Delete(context.Background(), name, metav1.DeleteOptions{PropagationPolicy: &fg})
	})
	labels := map[string]string{"app": name}
	req.labels = labels
	tmpl := req.pod(ns)
	onA100s(tmpl)
	tmpl.Spec.PriorityClassName = prio
	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: appsv1.DeploymentSpec{Replicas: &replicas, Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: v1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: tmpl.Spec}}}
	if _, err := client.AppsV1().Deployments(ns).Create(t.Context(), dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// nodeGangOnA100s creates gang name of 2 members of 4 GPUs that must
// share a node (PriorityClass prio when not "") on the A100 nodes, waits
// for both to run, and returns their node.
func nodeGangOnA100s(t *testing.T, c *nodesim.Cluster, ns, name, prio string) string {
	t.Helper()
	for i := range 2 {
		p := podSpec{name: fmt.Sprintf("%s-%d", name, i), gpus: 4, annotations: map[string]string{api.AnnotationGang: name,
			api.AnnotationGangMinMember: "2", api.AnnotationGangTopology: v1.LabelHostname + ":required"}}.pod(ns)
		onA100s(p)
		p.Spec.PriorityClassName = prio
		if _, err := c.Client().CoreV1().Pods(ns).Create(t.Context(), p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	var nodes []string
	for i := range 2 {
		p, _ := waitRunning(t, c, ns, fmt.Sprintf("%s-%d", name, i), time.Minute)
		nodes = append(nodes, p.Spec.NodeName)
	}
	if nodes[0] != nodes[1] {
		t.Fatalf("the gang's members run on %v, want one node", nodes)
	}
	return nodes[0]
}

// eventedPods lists, sorted, the pods of namespace ns with an Event of
// reason.
func eventedPods(t *testing.T, client kubernetes.Interface, ns, reason string) []string {
	t.Helper()
	l, err := client.CoreV1().Events(ns).List(t.Context(), metav1.ListOptions{FieldSelector: "reason=" + reason})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range l.Items {
		names = append(names, e.InvolvedObject.Name)
	}
	slices.Sort(names)
	return slices.Compact(names)
}

func create(t *testing.T, client kubernetes.Interface, ns string, s podSpec) *v1.Pod {
	t.Helper()
	p, err := client.CoreV1().Pods(ns).Create(t.Context(), s.pod(ns), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod %s: %v", s.name, err)
	}
	return p
}

// waitRunning waits for a pod to be Running and returns it with its node
// record.
func waitRunning(t *testing.T, c *nodesim.Cluster, ns, name string, timeout time.Duration) (*v1.Pod, *nodesim.PodRecord) {
	t.Helper()
	var last *v1.Pod
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		p, err := c.Client().CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		last = p
		if p.Status.Phase == v1.PodFailed {
			return false, fmt.Errorf("pod failed: %s: %s", p.Status.Reason, p.Status.Message)
		}
		return p.Status.Phase == v1.PodRunning, nil
	})
	if err != nil {
		t.Fatalf("pod %s/%s not Running: %v\n%s", ns, name, err, describe(t, c, last))
	}
	rec, err := c.Record(last)
	if err != nil || rec == nil {
		t.Fatalf("pod %s/%s: no node record (%v)", ns, name, err)
	}
	return last, rec
}

func describe(t *testing.T, c *nodesim.Cluster, p *v1.Pod) string {
	if p == nil {
		return "(never seen)"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "pod %s/%s node=%q phase=%s reason=%s message=%s\nannotations=%v\n", p.Namespace, p.Name, p.Spec.NodeName, p.Status.Phase, p.Status.Reason, p.Status.Message, p.Annotations)
	for _, cond := range p.Status.Conditions {
		fmt.Fprintf(&b, "  condition %s=%s %s %s\n", cond.Type, cond.Status, cond.Reason, cond.Message)
	}
	evs, err := c.Client().CoreV1().Events(p.Namespace).List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + p.Name})
	if err == nil {
		sort.Slice(evs.Items, func(i, j int) bool { return evs.Items[i].LastTimestamp.Before(&evs.Items[j].LastTimestamp) })
		for _, e := range evs.Items {
			fmt.Fprintf(&b, "  event %s %s: %s\n", e.Type, e.Reason, e.Message)
		}
	}
	return b.String()
}

func getPod(t *testing.T, client kubernetes.Interface, ns, name string) *v1.Pod {
	t.Helper()
	p, err := client.CoreV1().Pods(ns).Get(t.Context(), name, metav1.GetOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	return p
}

// inventory returns a node's GPU inventory.
func inventory(t *testing.T, c *nodesim.Cluster, node string) *api.GPUInventory {
	t.Helper()
	n, err := c.Client().CoreV1().Nodes().Get(t.Context(), node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	inv, ok, err := api.GetGPUInventory(n.Annotations)
	if !ok || err != nil {
		t.Fatalf("node %s inventory: ok=%v err=%v", node, ok, err)
	}
	return inv
}
