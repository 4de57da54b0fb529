package gpustatus

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-gpu/tessera/api"
)

var update = flag.Bool("update", false, "rewrite the golden files")

func uuid(node string, i int) string {
	h := 0
	for _, c := range node {
		h = h*31 + int(c)
	}
	return fmt.Sprintf("GPU-%08x-0000-0000-0000-%012d", h&0xffffffff, i)
}

func node(t *testing.T, name string, gpus int, unhealthy ...int) corev1.Node {
	t.Helper()
	inv := &api.GPUInventory{APIVersion: api.Version, Kind: api.KindGPUInventory, MemoryUnitMiB: 1024, Resources: []string{string(api.ResourceGPU)}}
	for i := 0; i < gpus; i++ {
		g := api.InventoryGPU{Index: i, UUID: uuid(name, i), Model: "NVIDIA A100-SXM4-40GB", MemoryMiB: 40960, MemoryUnits: 39, Healthy: true}
		for _, u := range unhealthy {
			if u == i {
				g.Healthy, g.Reason = false, "XID 79"
			}
		}
		inv.GPUs = append(inv.GPUs, g)
		row := make([]string, gpus)
		for j := range row {
			row[j] = "NV12"
		}
		row[i] = "X"
		inv.Links = append(inv.Links, row)
	}
	n := corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{}, Labels: map[string]string{"machine": "dgx-a100"}}}
	if err := api.SetGPUInventory(n.Annotations, inv); err != nil {
		t.Fatal(err)
	}
	return n
}

func pod(t *testing.T, ns, name, nodeName string, phase corev1.PodPhase, a *api.Assignment) corev1.Pod {
	t.Helper()
	p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: map[string]string{}},
		Spec: corev1.PodSpec{NodeName: nodeName}, Status: corev1.PodStatus{Phase: phase}}
	if a != nil {
		if err := api.SetAssignment(p.Annotations, a); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

func whole(node string, idx ...int) *api.Assignment {
	a := api.NewAssignment()
	c := api.ContainerAssignment{Name: "c"}
	for _, i := range idx {
		c.GPUs = append(c.GPUs, api.GPURef{UUID: uuid(node, i), Index: i})
	}
	a.Containers = append(a.Containers, c)
	return a
}

func slice(node string, i int, memMiB, cores int64) *api.Assignment {
	a := api.NewAssignment()
	a.Containers = append(a.Containers, api.ContainerAssignment{Name: "c", Shared: &api.SharedGPU{GPU: api.GPURef{UUID: uuid(node, i), Index: i}, MemoryMiB: memMiB, Cores: cores}})
	return a
}

func migUUID(node string, gpu, k int) string {
	h := 0
	for _, c := range node {
		h = h*31 + int(c)
	}
	return fmt.Sprintf("MIG-%08x-%04x-%04x-0000-000000000000", h&0xffffffff, gpu, k)
}

// migNode is node with 4 GPUs: 0 whole, 1 in MIG mode with 7 × 1g.5gb, 2
// in MIG mode with 3g.20gb + 2g.10gb + 1g.5gb (its 2g.10gb unhealthy), 3
// in MIG mode without instances.
func migNode(t *testing.T, name string) corev1.Node {
	t.Helper()
	n := node(t, name, 4)
	inv, _, err := api.GetGPUInventory(n.Annotations)
	if err != nil {
		t.Fatal(err)
	}
	type slot struct {
		profile     string
		start, size int
		healthy     bool
	}
	layouts := map[int][]slot{
		1: {{"1g.5gb", 0, 1, true}, {"1g.5gb", 1, 1, true}, {"1g.5gb", 2, 1, true}, {"1g.5gb", 3, 1, true}, {"1g.5gb", 4, 1, true}, {"1g.5gb", 5, 1, true}, {"1g.5gb", 6, 1, true}},
		2: {{"3g.20gb", 0, 4, true}, {"2g.10gb", 4, 2, false}, {"1g.5gb", 6, 1, true}},
		3: {},
	}
	for i, l := range layouts {
		g := &inv.GPUs[i]
		g.MemoryUnits, g.MIG = 0, &api.InventoryMIG{Instances: []api.InventoryMIGInstance{}}
		for k, s := range l {
			g.MIG.Instances = append(g.MIG.Instances, api.InventoryMIGInstance{UUID: migUUID(name, i, k), Profile: s.profile,
				MIGPlacement: api.MIGPlacement{Start: s.start, Size: s.size}, Healthy: s.healthy})
		}
	}
	if err := api.SetGPUInventory(n.Annotations, inv); err != nil {
		t.Fatal(err)
	}
	return n
}

// mig gives container c the instances (GPU, instance) of profile each.
func mig(node string, profile string, at ...[2]int) *api.Assignment {
	a := api.NewAssignment()
	c := api.ContainerAssignment{Name: "c"}
	for _, gk := range at {
		c.MIG = append(c.MIG, api.MIGRef{UUID: migUUID(node, gk[0], gk[1]), Profile: profile, GPU: api.GPURef{UUID: uuid(node, gk[0]), Index: gk[0]}})
	}
	a.Containers = append(a.Containers, c)
	return a
}

func TestFromObjectsAndRender(t *testing.T) {
	gated := pod(t, "team", "gang-0", "", corev1.PodPending, nil)
	gated.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: api.SchedulingGateGang}}
	if gated.Annotations == nil {
		gated.Annotations = map[string]string{}
	}
	gated.Annotations[api.AnnotationGang], gated.Annotations[api.AnnotationGangMinMember] = "gang", "2"
	unsched := pod(t, "team", "big", "", corev1.PodPending, nil)
	unsched.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Message: "0/2 nodes are available: 2 Insufficient tessera.dev/gpu."}}
	unsched.Spec.Containers = []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{api.ResourceGPU: resource.MustParse("9")}}}}
	// asks gives p one container asking for the resources.
	asks := func(p corev1.Pod, res corev1.ResourceList) corev1.Pod {
		p.Spec.Containers = []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{Limits: res}}}
		return p
	}
	tests := []struct {
		name    string
		nodes   []corev1.Node
		pods    []corev1.Pod
		machine string
		golden  string
		uses    map[string][]string // node -> use of each GPU
	}{
		{
			name:   "empty cluster",
			nodes:  []corev1.Node{node(t, "b", 2), node(t, "a", 1), {ObjectMeta: metav1.ObjectMeta{Name: "cpu-1"}}},
			golden: "empty.txt",
			uses:   map[string][]string{"a": {UseFree}, "b": {UseFree, UseFree}},
		},
		{
			name:  "whole, shared, unhealthy and pending",
			nodes: []corev1.Node{node(t, "a100-1", 4, 3)},
			pods: []corev1.Pod{
				pod(t, "train", "llm-0", "a100-1", corev1.PodRunning, whole("a100-1", 0, 1)),
				pod(t, "nb", "nb-1", "a100-1", corev1.PodRunning, slice("a100-1", 2, 8192, 25)),
				pod(t, "nb", "nb-2", "a100-1", corev1.PodRunning, slice("a100-1", 2, 4096, 10)),
				pod(t, "nb", "done", "a100-1", corev1.PodSucceeded, slice("a100-1", 2, 4096, 10)),
				pod(t, "nb", "failed", "a100-1", corev1.PodFailed, whole("a100-1", 3)),
				pod(t, "nb", "starting", "a100-1", corev1.PodPending, nil),
				gated, unsched,
			},
			machine: "machine",
			golden:  "mixed.txt",
			uses:    map[string][]string{"a100-1": {UseWhole, UseWhole, UseShared, UseUnhealthy}},
		},
		{
			name:  "whole and shared on one GPU is shown as over-committed",
			nodes: []corev1.Node{node(t, "n", 1)},
			pods: []corev1.Pod{
				pod(t, "a", "w", "n", corev1.PodRunning, whole("n", 0)),
				pod(t, "a", "s", "n", corev1.PodRunning, slice("n", 0, 1024, 5)),
			},
			golden: "overcommit.txt",
			uses:   map[string][]string{"n": {UseOvercommitted}},
		},
		{
			name:  "GPUs in MIG mode are never free: their instances and who holds them",
			nodes: []corev1.Node{migNode(t, "mig-1"), node(t, "a100-1", 1)},
			pods: []corev1.Pod{
				pod(t, "migt", "m1", "mig-1", corev1.PodRunning, mig("mig-1", "1g.5gb", [2]int{2, 2})),
				pod(t, "migt", "m3", "mig-1", corev1.PodRunning, mig("mig-1", "3g.20gb", [2]int{2, 0})),
				pod(t, "migt", "two", "mig-1", corev1.PodRunning, mig("mig-1", "1g.5gb", [2]int{1, 0}, [2]int{1, 4})),
				pod(t, "migt", "done", "mig-1", corev1.PodSucceeded, mig("mig-1", "1g.5gb", [2]int{1, 1})),
				pod(t, "migt", "elsewhere", "a100-1", corev1.PodRunning, mig("mig-1", "1g.5gb", [2]int{1, 2})),
				pod(t, "train", "w", "mig-1", corev1.PodRunning, whole("mig-1", 0)),
			},
			golden: "mig.txt",
			uses:   map[string][]string{"mig-1": {UseWhole, "mig", "mig", "mig"}, "a100-1": {UseFree}},
		},
		{
			name:  "what bound pods hold that the node agent has not recorded yet is listed, not shown free",
			nodes: []corev1.Node{migNode(t, "mig-1"), node(t, "a100-1", 4)},
			pods: []corev1.Pod{
				// two whole GPUs, none recorded (the agent is down)
				asks(pod(t, "train", "w2", "a100-1", corev1.PodRunning, nil), corev1.ResourceList{api.ResourceGPU: resource.MustParse("2")}),
				// three, one recorded
				asks(pod(t, "train", "w3", "a100-1", corev1.PodRunning, whole("a100-1", 0)), corev1.ResourceList{api.ResourceGPU: resource.MustParse("3")}),
				// a slice bound without the extender: its GPU is unknown
				asks(pod(t, "nb", "s", "a100-1", corev1.PodPending, nil), corev1.ResourceList{api.ResourceGPUMemory: resource.MustParse("4")}),
				// recorded in full: nothing listed
				asks(pod(t, "train", "w1", "a100-1", corev1.PodRunning, whole("a100-1", 3)), corev1.ResourceList{api.ResourceGPU: resource.MustParse("1")}),
				// two 1g.5gb and a 3g.20gb, one 1g.5gb recorded
				asks(pod(t, "migt", "m", "mig-1", corev1.PodRunning, mig("mig-1", "1g.5gb", [2]int{1, 0})),
					corev1.ResourceList{api.MIGResource("1g.5gb"): resource.MustParse("2"), api.MIGResource("3g.20gb"): resource.MustParse("1")}),
				// ended: holds nothing
				asks(pod(t, "train", "done", "a100-1", corev1.PodSucceeded, nil), corev1.ResourceList{api.ResourceGPU: resource.MustParse("4")}),
			},
			golden: "unrecorded.txt",
			uses:   map[string][]string{"mig-1": {UseFree, "mig", "mig", "mig"}, "a100-1": {UseWhole, UseFree, UseFree, UseWhole}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := FromObjects(tc.nodes, tc.pods, tc.machine)
			got := map[string][]string{}
			for _, n := range c.Nodes {
				for _, g := range n.GPUs {
					got[n.Name] = append(got[n.Name], g.Use())
				}
			}
			if diff := cmp.Diff(tc.uses, got); diff != "" {
				t.Errorf("uses (-want +got):\n%s", diff)
			}
			var b bytes.Buffer
			if err := Render(&b, c); err != nil {
				t.Fatal(err)
			}
			golden(t, tc.golden, b.Bytes())
			// The extender serves the model as JSON and kubectl tessera
			// renders what it decodes: the same table.
			js, err := json.Marshal(c)
			if err != nil {
				t.Fatal(err)
			}
			var back Cluster
			if err := json.Unmarshal(js, &back); err != nil {
				t.Fatal(err)
			}
			var b2 bytes.Buffer
			if err := Render(&b2, &back); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(b.String(), b2.String()); diff != "" {
				t.Errorf("rendered from JSON (-direct +from JSON):\n%s", diff)
			}
		})
	}
}

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to write it)", err)
	}
	if diff := cmp.Diff(string(want), string(got)); diff != "" {
		t.Errorf("%s (-want +got):\n%s", path, diff)
	}
}

func TestBar(t *testing.T) {
	for _, tc := range []struct {
		used, total int64
		want        string
	}{
		{0, 40960, "[..........]   0.0/40Gi"},
		{1, 40960, "[#.........]   0.0/40Gi"},
		{20480, 40960, "[#####.....]  20.0/40Gi"},
		{40960, 40960, "[##########]  40.0/40Gi"},
		{50000, 40960, "[##########]  48.8/40Gi"},
		{5, 0, ""},
	} {
		if got := Bar(tc.used, tc.total); got != tc.want {
			t.Errorf("Bar(%d, %d) = %q, want %q", tc.used, tc.total, got, tc.want)
		}
	}
}

func TestPendingReason(t *testing.T) {
	expires := metav1.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC).Time
	withPlan := func(p *corev1.Pod, plan api.GangPlan) *corev1.Pod {
		plan.Expires = expires
		if err := api.SetGangPlan(p.Annotations, plan); err != nil {
			t.Fatal(err)
		}
		return p
	}
	pod := func(ann map[string]string, gates ...string) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", Annotations: map[string]string{}}}
		for k, v := range ann {
			p.Annotations[k] = v
		}
		for _, g := range gates {
			p.Spec.SchedulingGates = append(p.Spec.SchedulingGates, corev1.PodSchedulingGate{Name: g})
		}
		return p
	}
	member := map[string]string{api.AnnotationGang: "g", api.AnnotationGangMinMember: "2"}
	// Gang "running" has two members bound, one ended; gang "g" none.
	var bound []*corev1.Pod
	for i, phase := range []corev1.PodPhase{corev1.PodRunning, corev1.PodPending, corev1.PodSucceeded} {
		b := pod(map[string]string{api.AnnotationGang: "running", api.AnnotationGangMinMember: "2"})
		b.Name, b.Spec.NodeName, b.Status.Phase = fmt.Sprintf("r-%d", i), "n1", phase
		bound = append(bound, b)
	}
	bound = append(bound, pod(member)) // unbound
	running := GangsRunning(bound)
	if diff := cmp.Diff(map[string]int{"ns/running": 2}, running); diff != "" {
		t.Errorf("GangsRunning (-want +got):\n%s", diff)
	}
	unschedulable := pod(nil)
	unschedulable.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Message: "0/4 nodes are available"}}
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		want string
	}{
		{"room held by GPUs", withPlan(pod(nil), api.GangPlan{Gang: "p", Node: "n1", GPUs: []api.GPURef{{UUID: uuid("n1", 5), Index: 5}, {UUID: uuid("n1", 7), Index: 7}}}),
			"the room freed for it (by preemption or quota reclaim) is held on GPUs 5, 7 of node n1 until 2026-11-28T12:00:00Z"},
		{"room held by count", withPlan(pod(nil), api.GangPlan{Gang: "p", Node: "n1"}),
			"the room freed for it (by preemption or quota reclaim) is held on node n1 until 2026-11-28T12:00:00Z"},
		{"planned gang member", withPlan(pod(member), api.GangPlan{Gang: "g", Node: "n1", GPU: &api.GPURef{UUID: uuid("n1", 2), Index: 2}}),
			"planned with its gang on GPU 2 of node n1, binding (the plan holds until 2026-11-28T12:00:00Z)"},
		{"gated gang member", pod(member, api.SchedulingGateGang), "gang member held until the whole gang fits"},
		{"gated member of a gang that runs", pod(map[string]string{api.AnnotationGang: "running", api.AnnotationGangMinMember: "2"}, api.SchedulingGateGang),
			"gang ns/running has 2 members running; this one joins when room for it is free (an elastic gang's extra member, or held by its max-member cap)"},
		{"gang gate, no gang", pod(nil, api.SchedulingGateGang), "gang gate on a pod that declares no gang: Tessera lifts it"},
		{"gang gate, no gang, queued", pod(nil, api.SchedulingGateGang, api.SchedulingGateQueue), "held by its queue until admitted"},
		{"gang gate, malformed gang", pod(map[string]string{api.AnnotationGangMinMember: "2"}, api.SchedulingGateGang), "gang member held until the whole gang fits"},
		{"queued", pod(nil, api.SchedulingGateQueue), "held by its queue until admitted"},
		{"malformed plan: the gate's reason", pod(map[string]string{api.AnnotationGangPlan: "{"}, api.SchedulingGateQueue), "held by its queue until admitted"},
		{"unschedulable", unschedulable, "0/4 nodes are available"},
		{"new", pod(nil), "waiting for the scheduler"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := PendingReason(tc.pod, running); got != tc.want {
				t.Errorf("PendingReason = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestFromObjectsSlicePeak: a pod's slices of a GPU count at the pod's
// peak, as the extender's fit counts them: an init container's slice is
// not added to the app containers' (it has ended when they run), a native
// sidecar's is.
func TestFromObjectsSlicePeak(t *testing.T) {
	const gib = 1024
	ctr := func(name string) corev1.Container { return corev1.Container{Name: name} }
	side := func(name string) corev1.Container {
		always := corev1.ContainerRestartPolicyAlways
		c := ctr(name)
		c.RestartPolicy = &always
		return c
	}
	// on gives each container its slice (GiB, cores) of GPU 0 of n1.
	on := func(slices map[string][2]int64) *api.Assignment {
		a := api.NewAssignment()
		for name, s := range slices {
			a.Containers = append(a.Containers, api.ContainerAssignment{Name: name, Shared: &api.SharedGPU{GPU: api.GPURef{UUID: uuid("n1", 0)}, MemoryMiB: s[0] * gib, Cores: s[1]}})
		}
		return a
	}
	for _, tc := range []struct {
		name                 string
		inits, containers    []corev1.Container
		slices               map[string][2]int64
		wantMemMiB, wantCore int64
	}{
		{"init and main", []corev1.Container{ctr("init")}, []corev1.Container{ctr("main")},
			map[string][2]int64{"init": {30, 60}, "main": {30, 60}}, 30 * gib, 60},
		{"sidecar and main", []corev1.Container{side("proxy")}, []corev1.Container{ctr("main")},
			map[string][2]int64{"proxy": {10, 30}, "main": {20, 60}}, 30 * gib, 90},
		{"several init containers", []corev1.Container{ctr("fetch"), ctr("convert")}, []corev1.Container{ctr("main")},
			map[string][2]int64{"fetch": {8, 10}, "convert": {24, 40}, "main": {12, 30}}, 24 * gib, 40},
		{"two app containers", nil, []corev1.Container{ctr("main"), ctr("helper")},
			map[string][2]int64{"main": {12, 30}, "helper": {4, 10}}, 16 * gib, 40},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := pod(t, "ns", "p", "n1", corev1.PodRunning, on(tc.slices))
			p.Spec.InitContainers, p.Spec.Containers = tc.inits, tc.containers
			other := pod(t, "ns", "q", "n1", corev1.PodRunning, slice("n1", 0, 2*gib, 5))
			c := FromObjects([]corev1.Node{node(t, "n1", 1)}, []corev1.Pod{p, other}, "")
			g := c.Nodes[0].GPUs[0]
			type use struct {
				Use           string
				Shared        []string
				MemMiB, Cores int64
			}
			want := use{UseShared, []string{"ns/p", "ns/q"}, tc.wantMemMiB + 2*gib, tc.wantCore + 5}
			if diff := cmp.Diff(want, use{g.Use(), g.Shared, g.MemoryUsedMiB, g.Cores}); diff != "" {
				t.Errorf("GPU 0 (-want +got):\n%s", diff)
			}
		})
	}
}

// TestCordonedNode: a cordoned node is marked, and so are its free GPUs
// (they take no new pod); a GPU in use is shown as it is.
func TestCordonedNode(t *testing.T) {
	cordoned := node(t, "c1", 2)
	cordoned.Spec.Unschedulable = true
	c := FromObjects([]corev1.Node{cordoned, node(t, "n1", 1)}, []corev1.Pod{pod(t, "ns", "w", "c1", corev1.PodRunning, whole("c1", 0))}, "")
	if got := []bool{c.Nodes[0].Cordoned, c.Nodes[1].Cordoned}; !cmp.Equal(got, []bool{true, false}) {
		t.Errorf("Cordoned of c1, n1 = %v, want [true false]", got)
	}
	var b bytes.Buffer
	if err := Render(&b, c); err != nil {
		t.Fatal(err)
	}
	want := `NODE           GPU  MODEL           USE             MEMORY                   COMPUTE  PODS
c1 (cordoned)  0    A100-SXM4-40GB  whole           [##########]  39.0/39Gi  100%     ns/w
               1    A100-SXM4-40GB  free, cordoned  [..........]   0.0/39Gi           
n1             0    A100-SXM4-40GB  free            [..........]   0.0/39Gi           

pods: 1 Running, 0 Pending, 0 Failed
`
	if diff := cmp.Diff(want, b.String()); diff != "" {
		t.Errorf("table (-want +got):\n%s", diff)
	}
}
