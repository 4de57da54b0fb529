package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/extender"
	"github.com/tessera-gpu/tessera/internal/gpustatus"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

var now = time.Date(2026, 11, 24, 4, 0, 0, 0, time.UTC)

const sealKey = "kubectl-tessera-unit-test-seal-key-0123456789"

func uuid(node string, i int) string {
	return fmt.Sprintf("GPU-%s-0000-0000-0000-00000000000%d", node, i)
}

func gpuNode(t *testing.T, name string, gpus int) *corev1.Node {
	t.Helper()
	inv := &api.GPUInventory{APIVersion: api.Version, Kind: api.KindGPUInventory, MemoryUnitMiB: 1024,
		Resources: []string{string(api.ResourceGPU), string(api.ResourceGPUMemory), string(api.ResourceGPUCore)}, SharedIsolation: true}
	for i := 0; i < gpus; i++ {
		inv.GPUs = append(inv.GPUs, api.InventoryGPU{Index: i, UUID: uuid("a1", i), Model: "NVIDIA A100-SXM4-40GB", MemoryMiB: 40960, MemoryUnits: 40, Healthy: true})
		row := make([]string, gpus)
		for j := range row {
			row[j] = "NV12"
		}
		row[i] = "X"
		inv.Links = append(inv.Links, row)
	}
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{}}}
	if err := api.SetGPUInventory(n.Annotations, inv); err != nil {
		t.Fatal(err)
	}
	return n
}

// gpuPod asks in container "c" for whole GPUs, or (memUnits, cores) a
// slice.
func gpuPod(ns, name string, whole, memUnits, cores int64, age time.Duration) *corev1.Pod {
	lim := corev1.ResourceList{}
	if whole > 0 {
		lim[api.ResourceGPU] = *resource.NewQuantity(whole, resource.DecimalSI)
	}
	if memUnits > 0 {
		lim[api.ResourceGPUMemory] = *resource.NewQuantity(memUnits, resource.DecimalSI)
		lim[api.ResourceGPUCore] = *resource.NewQuantity(cores, resource.DecimalSI)
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-" + ns + "-" + name), Annotations: map[string]string{},
			CreationTimestamp: metav1.NewTime(now.Add(-age))},
		Spec:   corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{Limits: lim}}}},
		Status: corev1.PodStatus{Phase: corev1.PodPending},
	}
}

func running(p *corev1.Pod, node string) *corev1.Pod {
	p.Spec.NodeName, p.Status.Phase = node, corev1.PodRunning
	return p
}

func sealed(t *testing.T, p *corev1.Pod, a *api.Assignment) *corev1.Pod {
	t.Helper()
	s, err := api.NewSealer([]byte(sealKey))
	if err != nil {
		t.Fatal(err)
	}
	ann, err := s.AssignmentAnnotations(p.UID, a)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range ann {
		p.Annotations[k] = v
	}
	return p
}

func assign(shared *api.SharedGPU, gpus ...api.GPURef) *api.Assignment {
	a := api.NewAssignment()
	a.Containers = []api.ContainerAssignment{{Name: "c", GPUs: gpus, Shared: shared}}
	return a
}

func queueObj(t *testing.T, q *api.Queue, status *api.QueueStatus) *unstructured.Unstructured {
	t.Helper()
	u := q.Unstructured()
	if status != nil {
		u.Object["status"] = status.Object()
	}
	return u
}

// fakeExtender answers PodView and OccupancyView from fixed values, or
// fails with err.
type fakeExtender struct {
	pods   map[string]*extender.PodStatus
	occ    *gpustatus.Cluster
	queues []extender.QueueView
	err    error
}

func (f *fakeExtender) Where() string { return "https://extender.test" }

func (f *fakeExtender) Get(_ context.Context, path string, v any) error {
	if f.err != nil {
		return f.err
	}
	switch {
	case path == extender.StatusOccupancyPath && f.occ != nil:
		*(v.(*gpustatus.Cluster)) = *f.occ
		return nil
	case path == extender.StatusQueuesPath && f.queues != nil:
		*(v.(*[]extender.QueueView)) = f.queues
		return nil
	case strings.HasPrefix(path, extender.StatusPodPath):
		if p, ok := f.pods[strings.TrimPrefix(path, extender.StatusPodPath)]; ok {
			*(v.(*extender.PodStatus)) = *p
			return nil
		}
	}
	return fmt.Errorf("tessera-extender https://extender.test%s: 404 Not Found", path)
}

type fixture struct {
	noKey    bool
	ext      extenderClient
	failList string // a resource whose list fails as if the API server were down
	mig      bool   // add migObjects
}

func migUUID(gpu, k int) string {
	return fmt.Sprintf("MIG-44cc%04x-%04x-0000-0000-000000000000", gpu, k)
}

// migObjects: node mig-1 of 4 A100s, GPUs 1 and 2 in MIG mode (1: 7 ×
// 1g.5gb; 2: 3g.20gb + 2g.10gb + 1g.5gb); migt/m1 holds GPU 2's 1g.5gb,
// migt/m3 its 3g.20gb, migt/q waits for a 2g.10gb.
func migObjects(t *testing.T) []runtime.Object {
	t.Helper()
	n := gpuNode(t, "mig-1", 4)
	inv, _, err := api.GetGPUInventory(n.Annotations)
	if err != nil {
		t.Fatal(err)
	}
	for i := range inv.GPUs {
		inv.GPUs[i].UUID = uuid("b1", i)
	}
	layouts := map[int][]api.InventoryMIGInstance{
		1: {{Profile: "1g.5gb", MIGPlacement: api.MIGPlacement{Start: 0, Size: 1}}, {Profile: "1g.5gb", MIGPlacement: api.MIGPlacement{Start: 1, Size: 1}},
			{Profile: "1g.5gb", MIGPlacement: api.MIGPlacement{Start: 2, Size: 1}}, {Profile: "1g.5gb", MIGPlacement: api.MIGPlacement{Start: 3, Size: 1}},
			{Profile: "1g.5gb", MIGPlacement: api.MIGPlacement{Start: 4, Size: 1}}, {Profile: "1g.5gb", MIGPlacement: api.MIGPlacement{Start: 5, Size: 1}},
			{Profile: "1g.5gb", MIGPlacement: api.MIGPlacement{Start: 6, Size: 1}}},
		2: {{Profile: "3g.20gb", MIGPlacement: api.MIGPlacement{Start: 0, Size: 4}}, {Profile: "2g.10gb", MIGPlacement: api.MIGPlacement{Start: 4, Size: 2}},
			{Profile: "1g.5gb", MIGPlacement: api.MIGPlacement{Start: 6, Size: 1}}},
	}
	for i, l := range layouts {
		g := &inv.GPUs[i]
		g.MemoryUnits, g.MIG = 0, &api.InventoryMIG{}
		for k, in := range l {
			in.UUID, in.Healthy = migUUID(i, k), true
			g.MIG.Instances = append(g.MIG.Instances, in)
		}
	}
	if err := api.SetGPUInventory(n.Annotations, inv); err != nil {
		t.Fatal(err)
	}
	migPod := func(name, profile string, age time.Duration) *corev1.Pod {
		p := gpuPod("migt", name, 0, 0, 0, age)
		p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{api.MIGResource(profile): resource.MustParse("1")}
		return p
	}
	holds := func(profile string, gpu, k int) *api.Assignment {
		a := api.NewAssignment()
		a.Containers = []api.ContainerAssignment{{Name: "c", MIG: []api.MIGRef{{UUID: migUUID(gpu, k), Profile: profile, GPU: api.GPURef{UUID: uuid("b1", gpu), Index: gpu}}}}}
		return a
	}
	return []runtime.Object{n,
		sealed(t, running(migPod("m1", "1g.5gb", 15*time.Second), "mig-1"), holds("1g.5gb", 2, 2)),
		sealed(t, running(migPod("m3", "3g.20gb", time.Minute), "mig-1"), holds("3g.20gb", 2, 0)),
		migPod("q", "2g.10gb", 5*time.Second),
	}
}

// cluster: node a100-1 with 2 GPUs and the CPU node cpu-1; train/llm holds
// GPU 0 (sealed), nb/nb-1 a sealed slice of GPU 1, nb/forged a slice its
// owner wrote (no seal) on GPU 1; team-a/wait is gated by its queue with
// Events; Queues team-a (guarantee 1, limit 2) and team-b (malformed);
// an ElasticQuota in team-a.
func (f fixture) env(t *testing.T) *env {
	t.Helper()
	wait := gpuPod("team-a", "wait", 1, 0, 0, 3*time.Minute)
	wait.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: api.SchedulingGateQueue}}
	prio := int32(10000)
	wait.Spec.Priority, wait.Spec.PriorityClassName = &prio, "training-standard"
	older := gpuPod("team-a", "older", 1, 0, 0, 5*time.Minute)
	older.Spec.SchedulingGates = wait.Spec.SchedulingGates
	older.Spec.Priority = &prio
	objs := []runtime.Object{
		gpuNode(t, "a100-1", 2),
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "cpu-1"}},
		sealed(t, running(gpuPod("train", "llm", 1, 0, 0, time.Hour), "a100-1"), assign(nil, api.GPURef{UUID: uuid("a1", 0), Index: 0})),
		sealed(t, running(gpuPod("nb", "nb-1", 0, 8, 25, time.Hour), "a100-1"), assign(&api.SharedGPU{GPU: api.GPURef{UUID: uuid("a1", 1), Index: 1}, MemoryMiB: 8192, Cores: 25})),
		func() *corev1.Pod {
			p := running(gpuPod("nb", "forged", 0, 4, 10, time.Hour), "a100-1")
			_ = api.SetAssignment(p.Annotations, assign(&api.SharedGPU{GPU: api.GPURef{UUID: uuid("a1", 1), Index: 1}, MemoryMiB: 30000, Cores: 10}))
			return p
		}(),
		wait, older,
		&corev1.Event{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "wait.1"}, InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: "team-a", Name: "wait", UID: wait.UID},
			Type: "Normal", Reason: api.EventQueueWaiting, Message: "queue team-a: team-a would use 3 tessera.dev/gpu, above its limit 2", Source: corev1.EventSource{Component: "tessera-extender"},
			LastTimestamp: metav1.NewTime(now.Add(-time.Minute)), Count: 4},
		&corev1.Event{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "other.1"}, InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: "team-a", Name: "older", UID: older.UID},
			Type: "Normal", Reason: api.EventQueueWaiting, Message: "not about wait", LastTimestamp: metav1.NewTime(now.Add(-time.Minute))},
	}
	for i, node := range []string{"a100-1", ""} {
		p := gpuPod("team-g", fmt.Sprintf("ring-%d", i), 1, 0, 0, 2*time.Minute)
		p.Labels = map[string]string{api.LabelPodGroup: "ring"}
		if node != "" {
			p = running(p, node) // its GPU not recorded yet
		} else {
			p.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: api.SchedulingGateGang}}
		}
		objs = append(objs, p)
	}
	// A pod its user gated for a gang it does not declare.
	loose := gpuPod("solo", "loose", 0, 0, 0, time.Minute)
	loose.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: api.SchedulingGateGang}}
	objs = append(objs, loose)
	// A pod preemption makes room for: its plan holds the two GPUs of
	// a100-1 by name while their pods leave.
	held := gpuPod("hi", "held", 2, 0, 0, time.Minute)
	sealer, err := api.NewSealer([]byte(sealKey))
	if err != nil {
		t.Fatal(err)
	}
	plan, err := sealer.GangPlanAnnotations(held.UID, api.GangPlan{Gang: "held", Node: "a100-1", Expires: now.Add(90 * time.Second),
		GPUs: []api.GPURef{{UUID: uuid("a1", 0), Index: 0}, {UUID: uuid("a1", 1), Index: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	maps.Copy(held.Annotations, plan)
	objs = append(objs, held)
	// The planner's reservation records: a gang holding a100-1, a pod
	// cooling down, and a cool-down that has ended (not shown).
	since, later, past := now.Add(-3*time.Minute), now.Add(10*time.Minute), now.Add(-time.Minute)
	recs, err := api.EncodeReservations([]api.ReservationRecord{
		{Workload: "team-g/ring", UIDs: []types.UID{"uid-team-g-ring-1"}, Since: &since, Nodes: []string{"a100-1"}},
		{Workload: "pod team-a/older", UIDs: []types.UID{older.UID}, Nodes: []string{"a100-1"}, NotBefore: &later},
		{Workload: "team-x/done", UIDs: []types.UID{"uid-x"}, NotBefore: &past},
	})
	if err != nil {
		t.Fatal(err)
	}
	objs = append(objs, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: api.ReservationsConfigMapName}, Data: map[string]string{api.ReservationsDataKey: recs}})
	if f.mig {
		objs = append(objs, migObjects(t)...)
	}
	if !f.noKey {
		objs = append(objs, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: api.SealKeySecretName}, Data: map[string][]byte{api.SealKeyDataKey: []byte(sealKey)}})
	}
	client := fake.NewClientset(objs...)
	if f.failList != "" {
		client.PrependReactor("list", f.failList, func(k8stesting.Action) (bool, runtime.Object, error) {
			return true, nil, errors.New("dial tcp 127.0.0.1:6443: connect: connection refused")
		})
	}
	limited := api.QueueResource{Guaranteed: 1, Limit: 2, Limited: true, Weight: 1}
	mig := api.MIGResource("1g.5gb")
	teamA := queueObj(t, &api.Queue{Name: "team-a", Namespaces: []string{"team-a"}, Resources: map[corev1.ResourceName]api.QueueResource{api.ResourceGPU: limited, mig: {Limit: 1, Limited: true, Weight: 1}}},
		&api.QueueStatus{Used: map[corev1.ResourceName]int64{api.ResourceGPU: 2, mig: 1}, Guaranteed: map[corev1.ResourceName]int64{api.ResourceGPU: 1},
			FairShare: map[corev1.ResourceName]int64{api.ResourceGPU: 2, mig: 7}, Usage: map[corev1.ResourceName]float64{api.ResourceGPU: 172800}, UsageUpdated: now.Add(-5 * time.Second)})
	teamB := queueObj(t, &api.Queue{Name: "team-b", Namespaces: []string{"team-b"}}, nil)
	teamB.Object["spec"].(map[string]any)["resources"] = map[string]any{"tessera.dev/gpu": map[string]any{"guaranteed": "3", "limit": "1"}}
	quota := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "ElasticQuota",
		"metadata": map[string]any{"namespace": "team-a", "name": "team-a"},
		"spec":     map[string]any{"min": map[string]any{"tessera.dev/gpu": "1"}, "max": map[string]any{"tessera.dev/gpu": "4", "tessera.dev/mig-1g.5gb": "2"}},
	}}
	ring := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
		"metadata": map[string]any{"namespace": "team-g", "name": "ring"},
		"spec":     map[string]any{"minMember": int64(2), "scheduleTimeoutSeconds": int64(300)},
		"status":   map[string]any{"phase": "Scheduling"},
	}}
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{
		api.QueueGVR: "QueueList", api.ElasticQuotaGVR: "ElasticQuotaList", api.PodGroupGVR: "PodGroupList", api.VolcanoPodGroupGVR: "PodGroupList",
	}, teamA, teamB, quota, ring)
	return &env{client: client, dyn: dyn, ext: f.ext, server: "https://127.0.0.1:6443", sealKeyNamespace: "kube-system", now: func() time.Time { return now }, stderr: &bytes.Buffer{}}
}

var waitOnExtender = &extender.PodStatus{Namespace: "team-a", Name: "wait", Phase: "Pending", Pending: &extender.PendingPod{
	Namespace: "team-a", Name: "wait", Queue: "team-a", Admission: "waits: queue team-a: team-a would use 3 tessera.dev/gpu, above its limit 2",
	Quota:   "admitted within its min",
	Fitting: 1, Nodes: []extender.NodeFit{{Node: "a100-1", Fits: true}, {Node: "cpu-1", Reason: "tessera: node has no GPU inventory"}},
}}

func TestSubcommands(t *testing.T) {
	ext := &fakeExtender{pods: map[string]*extender.PodStatus{"team-a/wait": waitOnExtender},
		occ: &gpustatus.Cluster{Nodes: []*gpustatus.Node{{Name: "from-extender", GPUs: []*gpustatus.GPU{{Index: 0, Model: "NVIDIA H100", MemoryMiB: 81920, Healthy: true, Whole: []string{"x/y"}}}}}}}
	down := &fakeExtender{err: errors.New("tessera-extender at https://extender.test is unreachable: connection refused (check --extender)")}
	tests := []struct {
		name    string
		fixture fixture
		run     func(*env, *bytes.Buffer) error
		golden  string
		// without: strings the output must not hold; errWants: the error's.
		without  []string
		errWants []string
		stderr   string
	}{
		{name: "status from the API, sealed assignments only", fixture: fixture{ext: ext},
			run: func(e *env, b *bytes.Buffer) error { return e.status(t.Context(), b) }, golden: "status.txt",
			// nb/forged's slice is not shown as Tessera's: it holds a GPU
			// of the node not recorded, as the extender's ledger counts it.
			without: []string{"nb/nb-1 nb/forged", "nb/forged nb/nb-1", "nb/forged (", "38.0/40Gi"}},
		{name: "status without the seal key asks the extender", fixture: fixture{noKey: true, ext: ext},
			run: func(e *env, b *bytes.Buffer) error { return e.status(t.Context(), b) }, golden: "status-extender.txt", stderr: "showing tessera-extender's ledger instead"},
		{name: "status without the seal key nor the extender fails", fixture: fixture{noKey: true, ext: down},
			run:      func(e *env, b *bytes.Buffer) error { return e.status(t.Context(), b) },
			errWants: []string{"reading the seal key (Secret kube-system/tessera-seal-key)", "not found", "asking the extender instead", "unreachable"}},
		{name: "status without the seal key and --extender=none fails", fixture: fixture{noKey: true},
			run:      func(e *env, b *bytes.Buffer) error { return e.status(t.Context(), b) },
			errWants: []string{"reading the seal key", "cannot be told from Tessera's", "drop --extender=none"}},
		{name: "status with the API server down", fixture: fixture{failList: "nodes"},
			run:      func(e *env, b *bytes.Buffer) error { return e.status(t.Context(), b) },
			errWants: []string{"reading nodes: the API server https://127.0.0.1:6443 is unreachable", "connection refused", "check --kubeconfig"}},
		{name: "queues with the extender's shares", fixture: fixture{ext: &fakeExtender{queues: []extender.QueueView{{Name: "team-a", Share: 1.75}}}},
			run: func(e *env, b *bytes.Buffer) error { return e.queues(t.Context(), b) }, golden: "queues.txt"},
		{name: "queues without the extender", fixture: fixture{ext: down},
			run: func(e *env, b *bytes.Buffer) error { return e.queues(t.Context(), b) }, golden: "queues-extender-down.txt"},
		{name: "explain a queued pending pod", fixture: fixture{ext: ext},
			run: func(e *env, b *bytes.Buffer) error { return e.explain(t.Context(), b, "team-a", "wait") }, golden: "explain-pending.txt", without: []string{"not about wait"}},
		{name: "explain a pending pod with the extender down", fixture: fixture{ext: down},
			run: func(e *env, b *bytes.Buffer) error { return e.explain(t.Context(), b, "team-a", "wait") }, golden: "explain-extender-down.txt"},
		{name: "explain a running pod", fixture: fixture{ext: &fakeExtender{}},
			run: func(e *env, b *bytes.Buffer) error { return e.explain(t.Context(), b, "train", "llm") }, golden: "explain-running.txt"},
		{name: "explain a pod whose assignment is its owner's", fixture: fixture{},
			run: func(e *env, b *bytes.Buffer) error { return e.explain(t.Context(), b, "nb", "forged") }, golden: "explain-forged.txt", without: []string{"30000 MiB"}},
		{name: "explain without the seal key shows no decision", fixture: fixture{noKey: true},
			run: func(e *env, b *bytes.Buffer) error { return e.explain(t.Context(), b, "train", "llm") }, golden: "explain-nokey.txt", without: []string{uuid("a1", 0)}},
		{name: "explain a gang member", fixture: fixture{},
			run: func(e *env, b *bytes.Buffer) error { return e.explain(t.Context(), b, "team-g", "ring-1") }, golden: "explain-gang.txt"},
		{name: "explain a pod gated for a gang it does not declare", fixture: fixture{},
			run: func(e *env, b *bytes.Buffer) error { return e.explain(t.Context(), b, "solo", "loose") }, golden: "explain-loose.txt"},
		{name: "explain a pod whose plan holds GPUs", fixture: fixture{},
			run: func(e *env, b *bytes.Buffer) error { return e.explain(t.Context(), b, "hi", "held") }, golden: "explain-held.txt"},
		{name: "status shows GPUs in MIG mode, their instances and holders", fixture: fixture{mig: true},
			run: func(e *env, b *bytes.Buffer) error { return e.status(t.Context(), b) }, golden: "status-mig.txt"},
		{name: "explain a running MIG pod", fixture: fixture{mig: true, ext: &fakeExtender{pods: map[string]*extender.PodStatus{"migt/m1": {
			Namespace: "migt", Name: "m1", Phase: "Running", Node: "mig-1",
			GPUs: []string{"MIG 1g.5gb " + migUUID(2, 2) + " on GPU 2 (A100-SXM4-40GB, " + uuid("b1", 2) + ") (container c)"}}}}},
			run: func(e *env, b *bytes.Buffer) error { return e.explain(t.Context(), b, "migt", "m1") }, golden: "explain-mig.txt"},
		{name: "explain a pending MIG pod", fixture: fixture{mig: true},
			run: func(e *env, b *bytes.Buffer) error { return e.explain(t.Context(), b, "migt", "q") }, golden: "explain-mig-pending.txt"},
		{name: "explain an unknown pod", fixture: fixture{},
			run:      func(e *env, b *bytes.Buffer) error { return e.explain(t.Context(), b, "team-a", "nope") },
			errWants: []string{"reading pod team-a/nope from the API server", "not found"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := tc.fixture.env(t)
			var out bytes.Buffer
			err := tc.run(e, &out)
			if tc.errWants != nil {
				if err == nil {
					t.Fatalf("no error; output:\n%s", out.String())
				}
				for _, w := range tc.errWants {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q lacks %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range tc.without {
				if strings.Contains(out.String(), w) {
					t.Errorf("output holds %q:\n%s", w, out.String())
				}
			}
			if tc.stderr != "" && !strings.Contains(e.stderr.(*bytes.Buffer).String(), tc.stderr) {
				t.Errorf("stderr %q lacks %q", e.stderr, tc.stderr)
			}
			golden(t, tc.golden, out.Bytes())
		})
	}
}

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (go test -update writes it)", err)
	}
	if diff := cmp.Diff(string(want), string(got)); diff != "" {
		t.Errorf("%s (-want +got):\n%s", path, diff)
	}
}

func TestQueuePosition(t *testing.T) {
	hi, lo := int32(100), int32(1)
	mk := func(name string, age time.Duration, prio *int32, node string) corev1.Pod {
		p := gpuPod("ns", name, 1, 0, 0, age)
		p.Spec.Priority, p.Spec.NodeName = prio, node
		return *p
	}
	all := &corev1.PodList{Items: []corev1.Pod{mk("old-lo", time.Hour, &lo, ""), mk("new-hi", time.Minute, &hi, ""), mk("mid-lo", 10*time.Minute, &lo, ""), mk("bound", 2*time.Hour, &hi, "n"), *gpuPod("other", "x", 1, 0, 0, 3*time.Hour)}}
	for _, tc := range []struct {
		name   string
		pos, n int
		ok     bool
	}{{"new-hi", 1, 3, true}, {"old-lo", 2, 3, true}, {"mid-lo", 3, 3, true}, {"bound", 0, 0, false}} {
		var pod *corev1.Pod
		for i := range all.Items {
			if all.Items[i].Name == tc.name {
				pod = &all.Items[i]
			}
		}
		pos, n, ok := queuePosition(pod, all, []string{"ns"})
		if pos != tc.pos || n != tc.n || ok != tc.ok {
			t.Errorf("%s: position %d of %d (%v), want %d of %d (%v)", tc.name, pos, n, ok, tc.pos, tc.n, tc.ok)
		}
	}
}

func TestRunArguments(t *testing.T) {
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u, namespace: team-a}}]
current-context: x
`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "no subcommand"},
		{[]string{"bogus"}, `unknown subcommand "bogus"`},
		{[]string{"explain"}, "explain takes one pod name"},
		{[]string{"status", "x"}, "status takes no arguments"},
		{[]string{"--kubeconfig", "/nonexistent", "status"}, "kubeconfig"},
		{[]string{"--kubeconfig", kubeconfig, "--context", "nope", "status"}, `context "nope" does not exist`},
		{[]string{"--kubeconfig", kubeconfig, "--extender-service", "bad", "status"}, "want namespace/name:port"},
		{[]string{"--kubeconfig", kubeconfig, "--extender=none", "--request-timeout=2s", "status"}, "reading nodes: the API server https://127.0.0.1:1 is unreachable"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var out, errOut bytes.Buffer
			err := run(t.Context(), tc.args, &out, &errOut)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("run(%q) = %v, want an error with %q", tc.args, err, tc.want)
			}
		})
	}
}
