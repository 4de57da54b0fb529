package extender_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/test/framework/controlplane"
)

const (
	// deployURL is the urlPrefix of deploy/extender/scheduler-config.yaml;
	// the tests replace it with the address of the extender they run.
	deployURL = "http://tessera-extender.kube-system.svc:8888"
	// extenderUser is the identity the extender runs as, bound to the
	// ClusterRole of deploy/extender/rbac.yaml.
	extenderUser = "tessera-extender"
	ns           = "default"
)

func repoRoot(t testing.TB) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Clean(filepath.Join(wd, "..", ".."))
}

var (
	buildOnce sync.Once
	buildBin  string
	buildErr  error
)

// extenderBinary builds cmd/tessera-extender once per test binary.
func extenderBinary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "tessera-extender-bin-")
		if err != nil {
			buildErr = err
			return
		}
		buildBin = filepath.Join(dir, "tessera-extender")
		cmd := exec.Command("go", "build", "-o", buildBin, "./cmd/tessera-extender")
		cmd.Dir = repoRoot(t)
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build tessera-extender: %w\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return buildBin
}

// extenderProc is the extender running as its own process.
type extenderProc struct {
	t          testing.TB
	bin        string
	kubeconfig string
	addr       string
	logPath    string
	mu         sync.Mutex
	cmd        *exec.Cmd
	done       chan struct{}
	starts     int
}

func (e *extenderProc) start(ctx context.Context) {
	e.t.Helper()
	e.mu.Lock()
	e.starts++
	logf, err := os.OpenFile(e.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		e.mu.Unlock()
		e.t.Fatal(err)
	}
	fmt.Fprintf(logf, "==== start %d at %s\n", e.starts, time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(e.bin, "--kubeconfig="+e.kubeconfig, "--listen="+e.addr, "--policy=binpack", "--v=2")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		e.mu.Unlock()
		e.t.Fatalf("start extender: %v", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); logf.Close(); close(done) }()
	e.cmd, e.done = cmd, done
	e.mu.Unlock()
	// Ready once its caches synced.
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		select {
		case <-done:
			return false, fmt.Errorf("extender exited")
		default:
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+e.addr+"/readyz", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
	if err != nil {
		e.t.Fatalf("extender not ready: %v\n%s", err, e.logTail())
	}
}

// kill sends SIGKILL: no graceful shutdown, what is in memory is lost.
func (e *extenderProc) kill() {
	e.mu.Lock()
	cmd, done := e.cmd, e.done
	e.cmd = nil
	e.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-done
}

func (e *extenderProc) stop() {
	e.mu.Lock()
	cmd, done := e.cmd, e.done
	e.cmd = nil
	e.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

func (e *extenderProc) logTail() string {
	b, _ := os.ReadFile(e.logPath)
	if len(b) > 32<<10 {
		b = b[len(b)-32<<10:]
	}
	return string(b)
}

// env is a control plane with kube-scheduler configured by deploy/, the
// extender as its own process, and a stand-in for the node agents.
type env struct {
	cp     *controlplane.ControlPlane
	client kubernetes.Interface
	ext    *extenderProc
	agent  *fakeAgent
}

func freeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// readDeploy reads one YAML document of kind from a deploy/extender file.
func readDeploy(t testing.TB, file, kind string, into any) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(repoRoot(t), "deploy", "extender", file))
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range strings.Split(string(raw), "\n---\n") {
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if meta.Kind == kind {
			if err := yaml.UnmarshalStrict([]byte(doc), into); err != nil {
				t.Fatalf("%s %s: %v", file, kind, err)
			}
			return
		}
	}
	t.Fatalf("%s has no %s", file, kind)
}

func startEnv(t *testing.T) *env {
	t.Helper()
	user := &controlplane.User{Name: extenderUser}
	cp := controlplane.StartForTest(t, controlplane.Options{Users: []*controlplane.User{user}})
	ctx := t.Context()
	client := cp.Client()

	// RBAC exactly as deployed, bound to the test's extender identity.
	var role rbacv1.ClusterRole
	readDeploy(t, "rbac.yaml", "ClusterRole", &role)
	if _, err := client.RbacV1().ClusterRoles().Create(ctx, &role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "tessera-extender-test"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: extenderUser}},
	}
	if _, err := client.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "extender.kubeconfig")
	kc := clientcmdapi.NewConfig()
	kc.Clusters["test"] = &clientcmdapi.Cluster{Server: cp.APIServerURL, CertificateAuthority: cp.CAFile()}
	kc.AuthInfos[extenderUser] = &clientcmdapi.AuthInfo{Token: user.Token}
	kc.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: extenderUser}
	kc.CurrentContext = "test"
	if err := clientcmd.WriteToFile(*kc, kubeconfig); err != nil {
		t.Fatal(err)
	}
	ext := &extenderProc{t: t, bin: extenderBinary(t), kubeconfig: kubeconfig, addr: freeAddr(t), logPath: filepath.Join(dir, "extender.log")}
	ext.start(ctx)
	t.Cleanup(func() {
		ext.stop()
		if t.Failed() {
			t.Logf("extender log:\n%s", ext.logTail())
			if b, err := os.ReadFile(ext.logPath); err == nil {
				_ = os.WriteFile(filepath.Join(os.TempDir(), "tessera-extender-failed.log"), b, 0o600)
			}
		}
	})

	// The scheduler configuration exactly as deployed, but for the address.
	raw, err := os.ReadFile(filepath.Join(repoRoot(t), "deploy", "extender", "scheduler-config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(raw, []byte(deployURL)) {
		t.Fatalf("scheduler-config.yaml does not use %s", deployURL)
	}
	cfg := filepath.Join(dir, "scheduler-config.yaml")
	if err := os.WriteFile(cfg, bytes.ReplaceAll(raw, []byte(deployURL), []byte("http://"+ext.addr)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := cp.StartScheduler(ctx, controlplane.SchedulerOptions{ConfigFile: cfg}); err != nil {
		t.Fatal(err)
	}
	agent := &fakeAgent{client: client}
	actx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); agent.run(actx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return &env{cp: cp, client: client, ext: ext, agent: agent}
}

// gpuUUID is GPU i of node.
func gpuUUID(node string, i int) string {
	h := uint32(2166136261)
	for _, c := range []byte(node) {
		h = (h ^ uint32(c)) * 16777619
	}
	return fmt.Sprintf("GPU-%08x-%04x", h, i)
}

type nodeSpec struct {
	name    string
	gpus    int
	model   string
	memMiB  int
	cliques [][]int // nil: all GPUs in one NVSwitch clique
	labels  map[string]string
}

// inventory is what the node agent would publish for spec.
func inventory(s nodeSpec) *api.GPUInventory {
	inv := &api.GPUInventory{APIVersion: api.Version, Kind: api.KindGPUInventory, MemoryUnitMiB: 1024, SharedIsolation: true,
		Resources: []string{string(api.ResourceGPU), string(api.ResourceGPUMemory), string(api.ResourceGPUCore)}}
	cliques := s.cliques
	if cliques == nil {
		all := make([]int, s.gpus)
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
	for i := 0; i < s.gpus; i++ {
		inv.GPUs = append(inv.GPUs, api.InventoryGPU{Index: i, UUID: gpuUUID(s.name, i), Model: s.model,
			MemoryMiB: uint64(s.memMiB), MemoryUnits: s.memMiB / 1024, NUMANode: i * 2 / s.gpus, Healthy: true})
		row := make([]string, s.gpus)
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

// createNode makes a ready Node with the inventory annotation and the
// extended resources a node agent would publish.
func (e *env) createNode(t testing.TB, s nodeSpec) {
	t.Helper()
	ann := map[string]string{}
	if err := api.SetGPUInventory(ann, inventory(s)); err != nil {
		t.Fatal(err)
	}
	q := func(n int) resource.Quantity { return *resource.NewQuantity(int64(n), resource.DecimalSI) }
	capacity := v1.ResourceList{
		v1.ResourceCPU:        resource.MustParse("256"),
		v1.ResourceMemory:     resource.MustParse("2048Gi"),
		v1.ResourcePods:       resource.MustParse("250"),
		api.ResourceGPU:       q(s.gpus),
		api.ResourceGPUMemory: q(s.gpus * (s.memMiB / 1024)),
		api.ResourceGPUCore:   q(s.gpus * api.CoresPerGPU),
	}
	n, err := e.cp.CreateReadyNode(t.Context(), controlplane.NodeOptions{Name: s.name, Labels: s.labels, Annotations: ann, Capacity: capacity})
	if err != nil {
		t.Fatal(err)
	}
	if len(n.Spec.Taints) > 0 {
		t.Fatalf("node %s has taints %v", s.name, n.Spec.Taints)
	}
}

type podSpec struct {
	name     string
	memUnits int64
	cores    int64
	gpus     int64
	model    string
	nvlink   bool
	selector map[string]string
	// node and assign pre-bind the pod (an existing workload).
	node   string
	assign *api.Assignment
	// priorityClass names a PriorityClass.
	priorityClass string
}

func (e *env) createPod(t testing.TB, s podSpec) *v1.Pod {
	t.Helper()
	limits := v1.ResourceList{}
	set := func(r v1.ResourceName, v int64) {
		if v > 0 {
			limits[r] = *resource.NewQuantity(v, resource.DecimalSI)
		}
	}
	set(api.ResourceGPUMemory, s.memUnits)
	set(api.ResourceGPUCore, s.cores)
	set(api.ResourceGPU, s.gpus)
	p := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: s.name, Namespace: ns, Annotations: map[string]string{}},
		Spec: v1.PodSpec{
			NodeSelector:      s.selector,
			NodeName:          s.node,
			PriorityClassName: s.priorityClass,
			Containers: []v1.Container{{Name: "main", Image: "registry.k8s.io/pause:3.10",
				Resources: v1.ResourceRequirements{Limits: limits, Requests: v1.ResourceList{v1.ResourceCPU: resource.MustParse("100m")}}}},
		},
	}
	if s.model != "" {
		p.Annotations[api.AnnotationGPUModel] = s.model
	}
	if s.nvlink {
		p.Annotations[api.AnnotationNVLink] = api.NVLinkRequired
	}
	if s.assign != nil {
		if err := api.SetAssignment(p.Annotations, s.assign); err != nil {
			t.Fatal(err)
		}
	}
	out, err := e.client.CoreV1().Pods(ns).Create(t.Context(), p, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func (e *env) waitBound(t testing.TB, name string, timeout time.Duration) *v1.Pod {
	t.Helper()
	p, err := e.cp.WaitForPod(t.Context(), ns, name, "bound", timeout, func(p *v1.Pod) (bool, error) { return p.Spec.NodeName != "", nil })
	if err != nil {
		t.Fatalf("%v\nevents: %s\nnodes: %s", err, e.events(t, name), e.nodeTaints(t))
	}
	return p
}

// nodeTaints describes the taints of every node, for failure messages.
func (e *env) nodeTaints(t testing.TB) string {
	nodes, err := e.client.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	for _, n := range nodes.Items {
		fmt.Fprintf(&b, "%s %v; ", n.Name, n.Spec.Taints)
	}
	return b.String()
}

// events returns the messages of the pod's events.
func (e *env) events(t testing.TB, pod string) string {
	t.Helper()
	list, err := e.client.CoreV1().Events(ns).List(t.Context(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod})
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	for _, ev := range list.Items {
		fmt.Fprintf(&b, "[%s %s] %s\n", ev.Type, ev.Reason, ev.Message)
	}
	return b.String()
}

// waitPendingWith waits until pod's FailedScheduling event or its
// PodScheduled condition (kube-scheduler writes both) contains want, and
// checks the pod is still not bound.
func (e *env) waitPendingWith(t testing.TB, pod, want string, timeout time.Duration) {
	t.Helper()
	var last string
	err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		last = e.events(t, pod)
		if strings.Contains(last, "FailedScheduling") && strings.Contains(last, want) {
			return true, nil
		}
		p, err := e.client.CoreV1().Pods(ns).Get(ctx, pod, metav1.GetOptions{})
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
	p, err := e.client.CoreV1().Pods(ns).Get(t.Context(), pod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Spec.NodeName != "" {
		t.Fatalf("pod %s is bound to %s, want Pending", pod, p.Spec.NodeName)
	}
}

// fakeAgent stands in for the node agents' device plugins: it records in
// each bound whole-GPU pod's assignment which GPUs it got, as the real
// agent does from the kubelet's allocation. Like the device plugin it
// avoids GPUs that any pod's assignment names, keeps NVLink pods in one
// clique, and prefers the highest free indices.
type fakeAgent struct {
	client kubernetes.Interface
	mu     sync.Mutex
	// errs are the pods it could not find GPUs for at its last look. A
	// stale shared claim (a pod whose Binding never happened, e.g. when the
	// extender was killed between the assignment patch and the Binding)
	// can cause that until the pod is rescheduled; an error that persists
	// until the end is an over-commitment.
	errs map[string]string
	// recorded counts whole-GPU pods recorded.
	recorded int
	log      []string
}

func (a *fakeAgent) errors() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []string
	for _, e := range a.errs {
		out = append(out, e)
	}
	sort.Strings(out)
	return out
}

func (a *fakeAgent) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(300 * time.Millisecond):
		}
		a.pass(ctx)
	}
}

func (a *fakeAgent) pass(ctx context.Context) {
	nodes, err := a.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return
	}
	invs := map[string]*api.GPUInventory{}
	for i := range nodes.Items {
		if inv, ok, err := api.GetGPUInventory(nodes.Items[i].Annotations); ok && err == nil {
			invs[nodes.Items[i].Name] = inv
		}
	}
	pods, err := a.client.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return
	}
	used := map[string]bool{} // GPU UUIDs named by any assignment
	for i := range pods.Items {
		if as, ok, err := api.GetAssignment(pods.Items[i].Annotations); ok && err == nil {
			for _, c := range as.Containers {
				for _, g := range c.GPUs {
					used[g.UUID] = true
				}
				if c.Shared != nil {
					used[c.Shared.GPU.UUID] = true
				}
			}
		}
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		inv := invs[p.Spec.NodeName]
		want := wholeGPUs(p)
		if inv == nil || want == 0 {
			continue
		}
		if _, ok := p.Annotations[api.AnnotationAssignment]; ok {
			continue
		}
		free := func(idx int) bool { return !used[inv.GPUs[idx].UUID] }
		var pick []int
		groups := [][]int{}
		if p.Annotations[api.AnnotationNVLink] == api.NVLinkRequired {
			groups = inv.NVLinkCliques
		} else {
			all := []int{}
			for k := range inv.GPUs {
				all = append(all, k)
			}
			groups = append(groups, all)
		}
		for _, g := range groups {
			var cand []int
			for k := len(g) - 1; k >= 0; k-- {
				if free(g[k]) {
					cand = append(cand, g[k])
				}
			}
			if len(cand) >= want {
				pick = cand[:want]
				break
			}
		}
		if pick == nil {
			a.mu.Lock()
			if a.errs == nil {
				a.errs = map[string]string{}
			}
			a.errs[p.Name] = fmt.Sprintf("no %d free GPUs for pod %s on node %s", want, p.Name, p.Spec.NodeName)
			a.mu.Unlock()
			continue
		}
		sort.Ints(pick)
		as := api.NewAssignment()
		var refs []api.GPURef
		for _, k := range pick {
			refs = append(refs, api.GPURef{UUID: inv.GPUs[k].UUID, Index: inv.GPUs[k].Index})
			used[inv.GPUs[k].UUID] = true
		}
		as.Containers = append(as.Containers, api.ContainerAssignment{Name: p.Spec.Containers[0].Name, GPUs: refs})
		value, err := api.EncodeAssignment(as)
		if err != nil {
			continue
		}
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{api.AnnotationAssignment: value}}})
		if _, err := a.client.CoreV1().Pods(p.Namespace).Patch(ctx, p.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err == nil {
			a.mu.Lock()
			a.recorded++
			a.log = append(a.log, fmt.Sprintf("%s %s on %s: GPUs %v", time.Now().Format("15:04:05.000"), p.Name, p.Spec.NodeName, pick))
			delete(a.errs, p.Name)
			a.mu.Unlock()
		}
	}
}

func limitOf(p *v1.Pod, r v1.ResourceName) int64 {
	var n int64
	for _, c := range p.Spec.Containers {
		if q, ok := c.Resources.Limits[r]; ok {
			n += q.Value()
		}
	}
	return n
}

func wholeGPUs(p *v1.Pod) int { return int(limitOf(p, api.ResourceGPU)) }

// checkNoOvercommit checks, from the Nodes' inventories and the pods'
// assignments only (not the extender's cache), that no GPU is
// over-committed on any dimension, that every bound pod got what it asked
// for on its own node, and that model and NVLink constraints hold.
func checkNoOvercommit(t testing.TB, client kubernetes.Interface) (bound int) {
	t.Helper()
	ctx := t.Context()
	nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	type gpuUse struct {
		node            string
		model           string
		memMiB, mem     int64
		cores           int64
		whole, sharedBy int
		clique          int
		pods            []string
	}
	gpus := map[string]*gpuUse{}
	for i := range nodes.Items {
		inv, ok, err := api.GetGPUInventory(nodes.Items[i].Annotations)
		if err != nil || !ok {
			continue
		}
		of := map[int]int{}
		for k, c := range inv.NVLinkCliques {
			for _, idx := range c {
				of[idx] = k + 1
			}
		}
		for _, g := range inv.GPUs {
			gpus[g.UUID] = &gpuUse{node: nodes.Items[i].Name, model: g.Model, memMiB: int64(g.MemoryUnits) * int64(inv.MemoryUnitMiB), clique: of[g.Index]}
		}
	}
	pods, err := client.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Spec.NodeName == "" {
			continue
		}
		bound++
		as, _, err := api.GetAssignment(p.Annotations)
		if err != nil {
			t.Errorf("pod %s: %v", p.Name, err)
			continue
		}
		mem, cores, whole := limitOf(p, api.ResourceGPUMemory), limitOf(p, api.ResourceGPUCore), wholeGPUs(p)
		models := []string{}
		if m := p.Annotations[api.AnnotationGPUModel]; m != "" {
			models = strings.Split(m, "|")
		}
		checkModel := func(g *gpuUse) {
			if len(models) == 0 {
				return
			}
			for _, m := range models {
				if api.ModelMatches(g.model, m) {
					return
				}
			}
			t.Errorf("pod %s asks for model %v, runs on %q", p.Name, models, g.model)
		}
		switch {
		case mem > 0 || cores > 0:
			if as == nil {
				t.Errorf("shared pod %s bound to %s without an assignment", p.Name, p.Spec.NodeName)
				continue
			}
			c := as.Container("main")
			if c == nil || c.Shared == nil {
				t.Errorf("shared pod %s: assignment %+v has no shared slice", p.Name, as)
				continue
			}
			g := gpus[c.Shared.GPU.UUID]
			if g == nil || g.node != p.Spec.NodeName {
				t.Errorf("shared pod %s on %s: GPU %s is not one of its node's", p.Name, p.Spec.NodeName, c.Shared.GPU.UUID)
				continue
			}
			wantMiB := mem * 1024
			if mem == 0 {
				wantMiB = (cores*g.memMiB + 99) / 100
			}
			if c.Shared.MemoryMiB != wantMiB || c.Shared.Cores != cores {
				t.Errorf("shared pod %s: assignment %d MiB %d cores, asked %d MiB %d cores", p.Name, c.Shared.MemoryMiB, c.Shared.Cores, wantMiB, cores)
			}
			g.mem += c.Shared.MemoryMiB
			g.cores += c.Shared.Cores
			g.sharedBy++
			g.pods = append(g.pods, p.Name)
			checkModel(g)
		case whole > 0:
			if as == nil {
				t.Errorf("whole-GPU pod %s on %s: the node agent never recorded its GPUs", p.Name, p.Spec.NodeName)
				continue
			}
			c := as.Container("main")
			if c == nil || len(c.GPUs) != whole {
				t.Errorf("whole-GPU pod %s: %d GPUs recorded, asked %d", p.Name, len(c.GPUs), whole)
				continue
			}
			cliques := map[int]bool{}
			for _, ref := range c.GPUs {
				g := gpus[ref.UUID]
				if g == nil || g.node != p.Spec.NodeName {
					t.Errorf("whole-GPU pod %s: GPU %s is not one of node %s's", p.Name, ref.UUID, p.Spec.NodeName)
					continue
				}
				g.whole++
				g.pods = append(g.pods, p.Name+"(whole)")
				cliques[g.clique] = true
				checkModel(g)
			}
			if p.Annotations[api.AnnotationNVLink] == api.NVLinkRequired && (len(cliques) != 1 || cliques[0]) {
				t.Errorf("pod %s requires NVLink, its GPUs span cliques %v", p.Name, cliques)
			}
		}
	}
	for uuid, g := range gpus {
		switch {
		case g.whole > 1:
			t.Errorf("GPU %s of %s is held whole by %d pods: %v", uuid, g.node, g.whole, g.pods)
		case g.whole == 1 && g.sharedBy > 0:
			t.Errorf("GPU %s of %s is held whole and shared by %d pods: %v", uuid, g.node, g.sharedBy, g.pods)
		case g.mem > g.memMiB:
			t.Errorf("GPU %s of %s: %d MiB assigned, %d MiB shared out", uuid, g.node, g.mem, g.memMiB)
		case g.cores > api.CoresPerGPU:
			t.Errorf("GPU %s of %s: %d cores assigned", uuid, g.node, g.cores)
		}
	}
	return bound
}

func itoa(i int) string { return strconv.Itoa(i) }
