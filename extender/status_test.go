package extender

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/allocator/quota"
	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/extender/internal/testbuild"
	"github.com/tessera-gpu/tessera/extender/planner"
	equota "github.com/tessera-gpu/tessera/extender/quota"
	"github.com/tessera-gpu/tessera/extender/verbs"
	"github.com/tessera-gpu/tessera/internal/gpustatus"
)

// statusFixture is a cluster of two 4-GPU nodes a and b and a node with a
// malformed inventory; on a: train/llm holds GPUs 0 and 1, nb/nb-1 and
// nb/nb-2 share GPU 2, nb/starting (bound, no GPUs recorded yet) holds one;
// team-a/wait (queued, 1 GPU) and default/huge (9 GPUs: fits nowhere) wait.
// The Queue team-a (ns team-a, guarantee 1) runs team-a/run on b (2 GPUs:
// borrowing 1); team-b (ns team-b, guarantee 2) is idle.
func statusFixture(t *testing.T) *Status {
	t.Helper()
	nodes := []*corev1.Node{
		testbuild.Node("a").GPUs(4, "NVIDIA A100-SXM4-40GB", 40960).Obj(),
		testbuild.Node("b").GPUs(4, "NVIDIA A100-SXM4-40GB", 40960).Obj(),
		testbuild.Node("broken").RawInventory("{").Obj(),
	}
	for _, n := range nodes {
		n.Status.Capacity = corev1.ResourceList{api.ResourceGPU: resource.MustParse("4")}
	}
	created := time.Date(2026, 11, 24, 1, 0, 0, 0, time.UTC)
	pod := func(b *testbuild.PodBuilder, ns string, phase corev1.PodPhase, age time.Duration) *corev1.Pod {
		p := b.Obj()
		p.Namespace, p.UID = ns, types.UID("uid-"+ns+"-"+p.Name)
		p.Status.Phase = phase
		p.CreationTimestamp = metav1.NewTime(created.Add(-age))
		return p
	}
	wait := pod(testbuild.Pod("wait").Whole(1), "team-a", corev1.PodPending, time.Minute)
	wait.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: api.SchedulingGateQueue}}
	huge := pod(testbuild.Pod("huge").Whole(9), "default", corev1.PodPending, 2*time.Minute)
	huge.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: "Unschedulable", Message: "0/3 nodes are available: 3 Insufficient tessera.dev/gpu."}}
	pods := []*corev1.Pod{
		pod(testbuild.Pod("llm").Whole(2).Node("a").Holding(0, 1), "train", corev1.PodRunning, time.Hour),
		pod(testbuild.Pod("nb-1").Shared(8, 25).Node("a").On(2, 8192, 25), "nb", corev1.PodRunning, time.Hour),
		pod(testbuild.Pod("nb-2").Shared(4, 10).Node("a").On(2, 4096, 10), "nb", corev1.PodRunning, time.Hour),
		pod(testbuild.Pod("starting").Whole(1).Node("a"), "nb", corev1.PodPending, time.Second),
		pod(testbuild.Pod("run").Whole(2).Node("b").Holding(0, 1), "team-a", corev1.PodRunning, time.Hour),
		pod(testbuild.Pod("cpu").CPU("1"), "default", corev1.PodSucceeded, time.Hour),
		wait, huge,
	}
	cache := newTestCache(t, nodes, pods)
	book := &planner.QueueBook{
		Queues: testbuild.Objects{testbuild.QueueObj(t, "team-a", "", []string{"team-a"}, 1, 0, created), testbuild.QueueObj(t, "team-b", "", []string{"team-b"}, 2, 0, created)},
		Pods:   func() ([]*corev1.Pod, error) { return pods, nil },
		Nodes:  func() ([]*corev1.Node, error) { return nodes, nil },
		Now:    func() time.Time { return created },
	}
	// default's ElasticQuota caps it at 4 GPUs: huge (9) waits for it too.
	enforcer := &equota.Enforcer{Ledger: &equota.Ledger{
		Quotas: staticQuotas{"default": quota.Quota{Namespace: "default", Min: gpus(0), Max: gpus(4)}},
		Pods: func(ns string) ([]*corev1.Pod, error) {
			var out []*corev1.Pod
			for _, p := range pods {
				if p.Namespace == ns {
					out = append(out, p)
				}
			}
			return out, nil
		},
		Nodes: func() ([]*corev1.Node, error) { return nodes, nil },
	}}
	s := NewStatus(cache, book, enforcer, func() ([]*corev1.Pod, error) { return pods, nil })
	s.now = func() time.Time { return created }
	return s
}

func take(t *testing.T, s *Status) *Snapshot {
	t.Helper()
	snap, err := s.Take(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return snap
}

func TestOccupancyView(t *testing.T) {
	c := OccupancyView(take(t, statusFixture(t)))
	type gpu struct {
		Use           string
		Whole, Shared []string
		MemMiB, Cores int64
	}
	got := map[string][]gpu{}
	errs := map[string]string{}
	unrecorded := map[string][]string{}
	for _, n := range c.Nodes {
		for _, g := range n.GPUs {
			got[n.Name] = append(got[n.Name], gpu{g.Use(), g.Whole, g.Shared, g.MemoryUsedMiB, g.Cores})
		}
		if n.Err != "" {
			errs[n.Name] = n.Err
		}
		if n.Unrecorded != nil {
			unrecorded[n.Name] = n.Unrecorded
		}
	}
	want := map[string][]gpu{
		"a": {
			{Use: "whole", Whole: []string{"train/llm"}},
			{Use: "whole", Whole: []string{"train/llm"}},
			{Use: "shared", Shared: []string{"nb/nb-1", "nb/nb-2"}, MemMiB: 12288, Cores: 35},
			{Use: "free"},
		},
		"b": {
			{Use: "whole", Whole: []string{"team-a/run"}},
			{Use: "whole", Whole: []string{"team-a/run"}},
			{Use: "free"}, {Use: "free"},
		},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("GPUs (-want +got):\n%s", diff)
	}
	if !strings.Contains(errs["broken"], "malformed GPU inventory") || len(errs) != 1 {
		t.Errorf("node errors: %v, want broken's malformed inventory only", errs)
	}
	if diff := cmp.Diff(map[string][]string{"a": {"nb/starting: 1 GPU(s)"}}, unrecorded); diff != "" {
		t.Errorf("unrecorded (-want +got):\n%s", diff)
	}
	if c.Pods.Running != 4 || len(c.Pods.Pending) != 3 || c.Pods.Failed != 0 {
		t.Errorf("pods = %+v, want 4 running, 3 pending", c.Pods)
	}
}

func TestQueuesView(t *testing.T) {
	got := map[string]QueueView{}
	for _, q := range QueuesView(take(t, statusFixture(t))) {
		got[q.Name] = q
	}
	for _, tc := range []struct {
		queue                               string
		used, pending, guaranteed, borrowed quota.Resources
		namespaces                          []string
	}{
		{"team-a", gpus(2), gpus(1), gpus(1), gpus(1), []string{"team-a"}},
		{"team-b", quota.Resources{}, quota.Resources{}, gpus(2), quota.Resources{}, []string{"team-b"}},
	} {
		t.Run(tc.queue, func(t *testing.T) {
			q, ok := got[tc.queue]
			if !ok {
				t.Fatalf("queue %s missing from %v", tc.queue, got)
			}
			if diff := cmp.Diff(tc, struct {
				queue                               string
				used, pending, guaranteed, borrowed quota.Resources
				namespaces                          []string
			}{q.Name, q.Used, q.Pending, q.Guaranteed, q.Borrowed, q.Namespaces}, cmp.AllowUnexported(tc)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
	if got["team-a"].Share <= got["team-b"].Share {
		t.Errorf("team-a's share %v should exceed idle team-b's %v", got["team-a"].Share, got["team-b"].Share)
	}
	if len(QueuesView(&Snapshot{})) != 0 {
		t.Error("no queues: want an empty list")
	}
}

func TestPendingView(t *testing.T) {
	snap := take(t, statusFixture(t))
	pending := PendingView(snap, false)
	var names []string
	for _, p := range pending {
		names = append(names, p.Namespace+"/"+p.Name)
	}
	// Oldest first; nb/starting is bound (not pending for the extender),
	// default/cpu is done and asks for no GPU.
	if diff := cmp.Diff([]string{"default/huge", "team-a/wait"}, names); diff != "" {
		t.Fatalf("pending (-want +got):\n%s", diff)
	}
	huge, wait := pending[0], pending[1]
	if huge.Fitting != 0 || huge.Reasons[string(TooFewGPUs)] != 2 || !strings.Contains(huge.Scheduler, "Insufficient tessera.dev/gpu") || huge.Queue != "" || huge.Demand != "9 whole GPU(s)" {
		t.Errorf("huge = %+v: want no node fitting (2 without enough GPUs), the scheduler's message, no queue", huge)
	}
	if !strings.HasPrefix(huge.Quota, "waits: ") || !strings.Contains(huge.Quota, "max") || wait.Quota != "" {
		t.Errorf("quota: huge %q, wait %q: want huge waiting for default's ElasticQuota max, wait ungoverned", huge.Quota, wait.Quota)
	}
	if huge.Nodes != nil {
		t.Errorf("PendingView without nodes listed nodes: %v", huge.Nodes)
	}
	if wait.Queue != "team-a" || wait.Fitting != 1 || !strings.HasPrefix(wait.Admission, "may start, borrowing") || len(wait.Gates) != 1 || wait.Gates[0] != api.SchedulingGateQueue {
		t.Errorf("wait = %+v: want queue team-a borrowing, gated, fitting b only (a's free GPU is held for nb/starting)", wait)
	}

	tests := []struct {
		ns, name  string
		want      *PodStatus
		wantNodes []NodeFit
	}{
		{ns: "train", name: "llm", want: &PodStatus{Namespace: "train", Name: "llm", Phase: "Running", Node: "a",
			GPUs: []string{"GPU 0 (A100-SXM4-40GB, " + testbuild.GPUUUID("a", 0) + ")", "GPU 1 (A100-SXM4-40GB, " + testbuild.GPUUUID("a", 1) + ")"}}},
		{ns: "nb", name: "nb-1", want: &PodStatus{Namespace: "nb", Name: "nb-1", Phase: "Running", Node: "a",
			GPUs: []string{"GPU 2 (A100-SXM4-40GB, " + testbuild.GPUUUID("a", 2) + "): 8192 MiB, 25% compute (container main)"}}},
		{ns: "team-a", name: "wait", wantNodes: []NodeFit{{Node: "b", Fits: true}, {Node: "a", Reason: "x"}, {Node: "broken", Reason: "x"}}},
		{ns: "nope", name: "nope"},
	}
	for _, tc := range tests {
		t.Run(tc.ns+"/"+tc.name, func(t *testing.T) {
			got := PodView(snap, tc.ns, tc.name)
			if tc.wantNodes != nil {
				if got == nil || got.Pending == nil {
					t.Fatalf("PodView = %+v, want pending", got)
				}
				nodes := got.Pending.Nodes
				if len(nodes) != len(tc.wantNodes) {
					t.Fatalf("nodes = %+v, want %d", nodes, len(tc.wantNodes))
				}
				for i, w := range tc.wantNodes {
					if nodes[i].Node != w.Node || nodes[i].Fits != w.Fits || (w.Reason != "") != (nodes[i].Reason != "") {
						t.Errorf("node %d = %+v, want %+v (a reason when it does not fit)", i, nodes[i], w)
					}
				}
				return
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestStatusHandlers(t *testing.T) {
	s := statusFixture(t)
	ready := false
	mux := http.NewServeMux()
	s.Register(mux, func() bool { return ready })
	srv := httptest.NewServer(mux)
	defer srv.Close()
	get := func(method, path string) (int, string, string) {
		req, err := http.NewRequest(method, srv.URL+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get("Content-Type"), string(b)
	}
	if code, _, _ := get("GET", StatusOccupancyPath); code != http.StatusServiceUnavailable {
		t.Errorf("before ready: %d, want 503", code)
	}
	ready = true
	tests := []struct {
		method, path string
		code         int
		ctype        string
		contains     []string
		decode       any
	}{
		{"GET", StatusOccupancyPath, 200, "application/json", []string{`"name":"a"`, `"train/llm"`}, &gpustatus.Cluster{}},
		{"GET", StatusQueuesPath, 200, "application/json", []string{`"name":"team-a"`, `"borrowed":{"tessera.dev/gpu":1}`}, &[]QueueView{}},
		{"GET", StatusPendingPath, 200, "application/json", []string{`"name":"huge"`, `"fitting":0`}, &[]PendingPod{}},
		{"GET", StatusPodPath + "team-a/wait", 200, "application/json", []string{`"nodes":[{"node":"b","fits":true},{"node":"a","fits":false,"reason":"tessera: fewer than 1 whole GPUs free`}, &PodStatus{}},
		{"GET", StatusPodPath + "team-a/gone", 404, "application/json", []string{"not in the extender's cache"}, &verbs.ErrorReply{}},
		{"GET", StatusPath, 200, "text/html; charset=utf-8", []string{`http-equiv="refresh"`, `data-node="a" data-gpu="2"`, "nb/nb-1 nb/nb-2", `data-queue="team-a"`, `data-pod="default/huge"`, "quota: waits: "}, nil},
		{"POST", StatusOccupancyPath, 405, "", nil, nil},
	}
	for _, tc := range tests {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			code, ctype, body := get(tc.method, tc.path)
			if code != tc.code {
				t.Fatalf("status %d, want %d: %s", code, tc.code, body)
			}
			if tc.ctype != "" && ctype != tc.ctype {
				t.Errorf("Content-Type %q, want %q", ctype, tc.ctype)
			}
			for _, c := range tc.contains {
				if !strings.Contains(body, c) {
					t.Errorf("body lacks %q:\n%s", c, body)
				}
			}
			if tc.decode != nil {
				if err := json.Unmarshal([]byte(body), tc.decode); err != nil {
					t.Errorf("decoding: %v", err)
				}
			}
		})
	}
}

// TestStatusPageEscapes: names come from tenants; the page escapes them.
func TestStatusPageEscapes(t *testing.T) {
	snap := &Snapshot{Nodes: map[string]*NodeState{}, Pods: []*corev1.Pod{testbuild.Pod("<script>x</script>").Whole(1).Obj()}}
	page, err := RenderPage(PageView(snap, time.Now()))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(page), "<script>") || !strings.Contains(string(page), "&lt;script&gt;") {
		t.Errorf("the pod name is not escaped:\n%s", page)
	}
}

// TestStatusPageShowsReservations: the planner's reservations, as kubectl
// tessera status words them.
func TestStatusPageShowsReservations(t *testing.T) {
	now := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	since := now.Add(-90 * time.Second)
	snap := &Snapshot{Nodes: map[string]*NodeState{}, Reservations: []api.ReservationRecord{
		{Workload: "tr/big", UIDs: []types.UID{"u1"}, Since: &since, Nodes: []string{"a100-1", "a100-2"}},
	}}
	page, err := RenderPage(PageView(snap, now))
	if err != nil {
		t.Fatal(err)
	}
	if want := "<li>gang tr/big: nodes a100-1, a100-2 reserved for it since 2026-11-28T11:58:30Z (1m30s ago)</li>"; !strings.Contains(string(page), want) {
		t.Errorf("the page lacks %q:\n%s", want, page)
	}
	page, err = RenderPage(PageView(&Snapshot{Nodes: map[string]*NodeState{}}, now))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(page), "No workload holds a reservation.") {
		t.Errorf("without reservations the page does not say so:\n%s", page)
	}
}

func TestStatusMetrics(t *testing.T) {
	s := statusFixture(t)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(s.Collector())
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			got[f.GetName()+labelString(m)] = m.GetGauge().GetValue()
		}
	}
	for key, want := range map[string]float64{
		`tessera_extender_gpus{model="A100-SXM4-40GB",node="a",use="whole"}`:            2,
		`tessera_extender_gpus{model="A100-SXM4-40GB",node="a",use="shared"}`:           1,
		`tessera_extender_gpus{model="A100-SXM4-40GB",node="a",use="free"}`:             1,
		`tessera_extender_gpus{model="A100-SXM4-40GB",node="a",use="unhealthy"}`:        0,
		`tessera_extender_gpu_slice_memory_used_bytes{model="A100-SXM4-40GB",node="a"}`: 12288 << 20,
		`tessera_extender_pending_gpu_pods{fits="false"}`:                               1,
		`tessera_extender_pending_gpu_pods{fits="true"}`:                                1,
		`tessera_extender_queue_borrowed{queue="team-a",resource="tessera.dev/gpu"}`:    1,
		`tessera_extender_queue_guaranteed{queue="team-b",resource="tessera.dev/gpu"}`:  2,
		`tessera_extender_queue_used{queue="team-a",resource="tessera.dev/gpu"}`:        2,
	} {
		if v, ok := got[key]; !ok || v != want {
			t.Errorf("%s = %v (present %v), want %v", key, v, ok, want)
		}
	}
	for _, key := range []string{`tessera_extender_node_fragmented_gpus{model="A100-SXM4-40GB",node="a"}`, `tessera_extender_queue_share{queue="team-a"}`} {
		if _, ok := got[key]; !ok {
			t.Errorf("%s missing", key)
		}
	}
	// The measure is the allocator's, in GPUs: between 0 and the node's 4.
	for _, n := range []string{"a", "b"} {
		if v := got[`tessera_extender_node_fragmented_gpus{model="A100-SXM4-40GB",node="`+n+`"}`]; v < 0 || v > 4 {
			t.Errorf("fragmentation of %s = %v, want 0..4 GPUs", n, v)
		}
	}
}

func labelString(m *dto.Metric) string {
	var parts []string
	for _, l := range m.GetLabel() {
		parts = append(parts, l.GetName()+`="`+l.GetValue()+`"`)
	}
	return "{" + strings.Join(parts, ",") + "}"
}

// TestPendingNodeRefusesPod: a node the pod may not go to (cordoned, a
// taint it does not tolerate) does not count as fitting, whatever is
// free there, and says why in kube-scheduler's words.
func TestPendingNodeRefusesPod(t *testing.T) {
	cordoned := testbuild.Node("c").GPUs(4, "A100", 40960).Obj()
	cordoned.Spec.Unschedulable = true
	tainted := testbuild.Node("t").GPUs(4, "A100", 40960).Obj()
	tainted.Spec.Taints = []corev1.Taint{{Key: "dedicated", Value: "infer", Effect: corev1.TaintEffectNoSchedule}}
	free := testbuild.Node("f").GPUs(4, "A100", 40960).Obj()
	snap := &Snapshot{Nodes: newTestCache(t, []*corev1.Node{cordoned, tainted, free}, nil).Snapshot()}
	pp := pendingOf(snap, testbuild.Pod("p").Whole(1).Obj(), true)
	if pp.Fitting != 1 || pp.Reasons[ReasonNodeRefusesPod] != 2 {
		t.Errorf("fitting %d, reasons %v: want 1 fitting (f), 2 nodes refusing the pod", pp.Fitting, pp.Reasons)
	}
	want := []NodeFit{
		{Node: "f", Fits: true},
		{Node: "c", Reason: "tessera: node is cordoned (unschedulable)"},
		{Node: "t", Reason: "tessera: untolerated taint {dedicated: infer}"},
	}
	if diff := cmp.Diff(want, pp.Nodes); diff != "" {
		t.Errorf("nodes (-want +got):\n%s", diff)
	}
}

// A pod that asks only for nvidia.com/gpu is not "no GPU": the views say
// Tessera does not place it (explain said "Asks for: no GPU" while the pod
// waited on "Insufficient nvidia.com/gpu").
func TestDescribePodDemand(t *testing.T) {
	nvidia := testbuild.Pod("legacy").Obj()
	nvidia.Spec.Containers[0].Resources.Limits = corev1.ResourceList{api.ResourceNVIDIAGPU: resource.MustParse("2")}
	for _, tc := range []struct {
		pod  *corev1.Pod
		want string
	}{
		{nvidia, "2 nvidia.com/gpu, which Tessera does not place"},
		{testbuild.Pod("whole").Whole(1).Obj(), "1 whole GPU(s)"},
		{testbuild.Pod("cpu").Obj(), "no GPU"},
	} {
		d, err := ParseDemand(tc.pod)
		if err != nil {
			t.Fatalf("%s: %v", tc.pod.Name, err)
		}
		if got := DescribePodDemand(tc.pod, &d); !strings.HasPrefix(got, tc.want) {
			t.Errorf("%s: %q, want it to start with %q", tc.pod.Name, got, tc.want)
		}
	}
}
