package plugin

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/tessera-gpu/tessera/api"
)

// fakeCore answers like the extender's Server: fit says which nodes fit,
// best which of them the shortlist keeps (nil: all).
type fakeCore struct {
	fit, best  sets.Set[string]
	err        string
	scores     map[string]int64
	filtered   [][]string // node names of each filter call
	all        []bool     // whether each filter call was FilterAll
	seen       []*corev1.Pod
	reserved   map[types.UID]string
	reserveErr error
	bound      []string
	// freeing: RoomBeingFreed's answer; freeingAsked the nodes it was
	// asked about.
	freeing      bool
	freeingAsked [][]string
}

func (f *fakeCore) RoomBeingFreed(_ *corev1.Pod, nodes []string) bool {
	f.freeingAsked = append(f.freeingAsked, nodes)
	return f.freeing
}

func (f *fakeCore) filter(args *extenderv1.ExtenderArgs, all bool) *extenderv1.ExtenderFilterResult {
	f.filtered = append(f.filtered, append([]string(nil), *args.NodeNames...))
	f.all = append(f.all, all)
	f.seen = append(f.seen, args.Pod)
	res := &extenderv1.ExtenderFilterResult{FailedNodes: extenderv1.FailedNodesMap{}, FailedAndUnresolvableNodes: extenderv1.FailedNodesMap{}, Error: f.err}
	out := []string{}
	for _, n := range *args.NodeNames {
		switch {
		case !f.fit.Has(n):
			res.FailedNodes[n] = "not enough GPUs"
		case all || f.best == nil || f.best.Has(n):
			out = append(out, n)
		}
	}
	res.NodeNames = &out
	return res
}

func (f *fakeCore) FilterArgs(_ context.Context, args *extenderv1.ExtenderArgs) *extenderv1.ExtenderFilterResult {
	return f.filter(args, false)
}

func (f *fakeCore) FilterAll(_ context.Context, args *extenderv1.ExtenderArgs) *extenderv1.ExtenderFilterResult {
	return f.filter(args, true)
}

func (f *fakeCore) PrioritizeArgs(_ context.Context, args *extenderv1.ExtenderArgs, _ bool) (extenderv1.HostPriorityList, error) {
	var out extenderv1.HostPriorityList
	for _, n := range *args.NodeNames {
		out = append(out, extenderv1.HostPriority{Host: n, Score: f.scores[n]})
	}
	return out, nil
}

func (f *fakeCore) Reserve(pod *corev1.Pod, node string) error {
	if f.reserveErr != nil {
		return f.reserveErr
	}
	if f.reserved == nil {
		f.reserved = map[types.UID]string{}
	}
	f.reserved[pod.UID] = node
	return nil
}

func (f *fakeCore) Unreserve(uid types.UID) { delete(f.reserved, uid) }

func (f *fakeCore) Bind(_ context.Context, args *extenderv1.ExtenderBindingArgs) error {
	f.bound = append(f.bound, args.PodName+"@"+args.Node)
	return nil
}

// stripTrust removes every tessera.dev annotation, as the trust filter
// does with those not sealed.
type stripTrust struct{}

func (stripTrust) Pod(p *corev1.Pod) []api.Ignored {
	for k := range p.Annotations {
		if strings.HasPrefix(k, "tessera.dev/") {
			delete(p.Annotations, k)
		}
	}
	return nil
}

type activations struct{ keys []string }

func (a *activations) Activate(_ klog.Logger, pods map[string]*corev1.Pod) {
	for k := range pods {
		a.keys = append(a.keys, k)
	}
}

func node(name string, mod ...func(*corev1.Node)) fwk.NodeInfo {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/hostname": name}}}
	for _, m := range mod {
		m(n)
	}
	ni := framework.NewNodeInfo()
	ni.SetNode(n)
	return ni
}

func gpuPod(name string, gpus int64) *corev1.Pod {
	q := resource.NewQuantity(gpus, resource.DecimalSI)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID("uid-" + name), Annotations: map[string]string{api.AnnotationAssignment: "forged"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{api.ResourceGPU: *q}, Limits: corev1.ResourceList{api.ResourceGPU: *q}}}}},
	}
}

func cpuPod(name string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID("uid-" + name)},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c"}}}}
}

func newPlugin(core *fakeCore) (*Plugin, *activations, *clocktesting.FakePassiveClock) {
	act := &activations{}
	clk := clocktesting.NewFakePassiveClock(time.Unix(1000, 0))
	return New(core, stripTrust{}, func() bool { return true }, act, clk), act, clk
}

func TestPreFilter(t *testing.T) {
	taint := func(n *corev1.Node) {
		n.Spec.Taints = []corev1.Taint{{Key: "dedicated", Value: "infer", Effect: corev1.TaintEffectNoSchedule}}
	}
	soft := func(n *corev1.Node) {
		n.Spec.Taints = []corev1.Taint{{Key: "spot", Effect: corev1.TaintEffectPreferNoSchedule}}
	}
	label := func(n *corev1.Node) { n.Labels["pool"] = "a100" }
	cordoned := func(n *corev1.Node) { n.Spec.Unschedulable = true }
	nodes := []fwk.NodeInfo{node("n0"), node("n1", taint), node("n2", label), node("n3", soft), node("n4", cordoned)}
	tests := []struct {
		name        string
		pod         func() *corev1.Pod
		fit, best   []string
		err         string
		wantSent    []string
		wantNodes   []string
		wantCode    fwk.Code
		wantMessage string
		narrowed    bool
	}{
		{
			name: "eligible nodes sent, shortlist returned", pod: func() *corev1.Pod { return gpuPod("p", 1) },
			fit: []string{"n0", "n2", "n3"}, best: []string{"n2"},
			wantSent: []string{"n0", "n2", "n3"}, wantNodes: []string{"n2"}, narrowed: true,
		},
		{
			name: "toleration admits the tainted node", pod: func() *corev1.Pod {
				p := gpuPod("p", 1)
				p.Spec.Tolerations = []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpEqual, Value: "infer", Effect: corev1.TaintEffectNoSchedule}}
				return p
			},
			fit: []string{"n0", "n1", "n2", "n3"}, wantSent: []string{"n0", "n1", "n2", "n3"}, wantNodes: []string{"n0", "n1", "n2", "n3"},
		},
		{
			name: "cordoned node tolerated", pod: func() *corev1.Pod {
				p := gpuPod("p", 1)
				p.Spec.Tolerations = []corev1.Toleration{{Key: corev1.TaintNodeUnschedulable, Operator: corev1.TolerationOpExists}}
				return p
			},
			fit: []string{"n4"}, wantSent: []string{"n0", "n2", "n3", "n4"}, wantNodes: []string{"n4"},
		},
		{
			name: "node selector", pod: func() *corev1.Pod {
				p := gpuPod("p", 1)
				p.Spec.NodeSelector = map[string]string{"pool": "a100"}
				return p
			},
			fit: []string{"n0", "n2"}, wantSent: []string{"n2"}, wantNodes: []string{"n2"},
		},
		{
			name: "fits nowhere: unresolvable, with the reasons", pod: func() *corev1.Pod { return gpuPod("p", 9) },
			wantSent: []string{"n0", "n2", "n3"}, wantCode: fwk.UnschedulableAndUnresolvable,
			wantMessage: "2 node(s) had untolerated taints, were cordoned or did not match the pod's node affinity; 3 node(s): not enough GPUs",
		},
		{
			name: "the extender's error is an error", pod: func() *corev1.Pod { return gpuPod("p", 1) }, err: "bad request",
			wantSent: []string{"n0", "n2", "n3"}, wantCode: fwk.Error, wantMessage: "bad request",
		},
		{
			name: "CPU-only pod skipped", pod: func() *corev1.Pod { return cpuPod("c") }, wantCode: fwk.Skip,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			core := &fakeCore{fit: sets.New(tc.fit...), err: tc.err}
			if tc.best != nil {
				core.best = sets.New(tc.best...)
			}
			p, _, _ := newPlugin(core)
			state := framework.NewCycleState()
			pod := tc.pod()
			res, st := p.PreFilter(context.Background(), state, pod, nodes)
			if st.Code() != tc.wantCode {
				t.Fatalf("status %v, want code %v", st, tc.wantCode)
			}
			if tc.wantMessage != "" && st.Message() != tc.wantMessage {
				t.Errorf("message %q, want %q", st.Message(), tc.wantMessage)
			}
			if tc.wantSent != nil {
				if len(core.filtered) != 1 {
					t.Fatalf("%d filter calls, want 1", len(core.filtered))
				}
				if diff := cmp.Diff(tc.wantSent, core.filtered[0]); diff != "" {
					t.Errorf("nodes sent (-want +got):\n%s", diff)
				}
				if _, forged := core.seen[0].Annotations[api.AnnotationAssignment]; forged {
					t.Error("the extender was sent the pod's own tessera.dev annotation")
				}
				if _, kept := pod.Annotations[api.AnnotationAssignment]; !kept {
					t.Error("the scheduler's pod was changed (the trust filter must work on a copy)")
				}
			} else if len(core.filtered) != 0 {
				t.Errorf("filter called %d times, want none", len(core.filtered))
			}
			if tc.wantNodes != nil {
				if diff := cmp.Diff(sets.New(tc.wantNodes...), res.NodeNames); diff != "" {
					t.Errorf("PreFilterResult (-want +got):\n%s", diff)
				}
				if c := readCycle(state); c == nil || c.narrowed != tc.narrowed {
					t.Errorf("cycle %+v, want narrowed %v", c, tc.narrowed)
				}
			}
		})
	}
}

func TestPreFilterNotReady(t *testing.T) {
	core := &fakeCore{fit: sets.New("n0")}
	clk := clocktesting.NewFakePassiveClock(time.Now())
	var polls atomic.Int32
	p := New(core, stripTrust{}, func() bool { polls.Add(1); return false }, &activations{}, clk)
	p.readyBy = clk.Now().Add(100 * time.Millisecond)
	_, st := p.PreFilter(context.Background(), framework.NewCycleState(), gpuPod("p", 1), []fwk.NodeInfo{node("n0")})
	if st.Code() != fwk.Error || !errors.Is(st.AsError(), errNotReady) {
		t.Fatalf("status %v, want the not-ready error", st)
	}
	if len(core.filtered) != 0 {
		t.Error("filtered before the caches synced")
	}
	// Past readyBy nothing waits: the answer comes at once.
	if polls.Load() < 2 {
		t.Errorf("readiness asked %d times before readyBy, want a wait", polls.Load())
	}
	clk.SetTime(clk.Now().Add(readyWait))
	polls.Store(0)
	if _, st := p.PreFilter(context.Background(), framework.NewCycleState(), gpuPod("p", 1), []fwk.NodeInfo{node("n0")}); !errors.Is(st.AsError(), errNotReady) {
		t.Fatalf("status %v, want the not-ready error", st)
	}
	if polls.Load() != 1 {
		t.Errorf("readiness asked %d times past readyBy, want once (no wait)", polls.Load())
	}
}

// A pod of the first moments after a start waits for the caches to sync
// (within readyWait) instead of failing its cycle with an error.
func TestPreFilterWaitsForSync(t *testing.T) {
	core := &fakeCore{fit: sets.New("n0")}
	var polls atomic.Int32
	ready := func() bool { return polls.Add(1) > 3 }
	p := New(core, stripTrust{}, ready, &activations{}, clocktesting.NewFakePassiveClock(time.Now()))
	res, st := p.PreFilter(context.Background(), framework.NewCycleState(), gpuPod("p", 1), []fwk.NodeInfo{node("n0")})
	if !st.IsSuccess() {
		t.Fatalf("status %v, want success once the caches synced", st)
	}
	if diff := cmp.Diff(sets.New("n0"), res.NodeNames); diff != "" {
		t.Errorf("PreFilterResult (-want +got):\n%s", diff)
	}
}

// A pod whose shortlist all failed kube-scheduler's other filters is
// re-activated without preemption and filtered with every fitting node
// until it is reserved or a minute passes.
func TestPostFilterWidens(t *testing.T) {
	core := &fakeCore{fit: sets.New("n0", "n1", "n2"), best: sets.New("n0")}
	p, act, clk := newPlugin(core)
	nodes := []fwk.NodeInfo{node("n0"), node("n1"), node("n2")}
	pod := gpuPod("p", 1)
	ctx := context.Background()

	state := framework.NewCycleState()
	if _, st := p.PreFilter(ctx, state, pod, nodes); !st.IsSuccess() {
		t.Fatal(st)
	}
	_, st := p.PostFilter(ctx, state, pod, nil)
	if st.Code() != fwk.UnschedulableAndUnresolvable {
		t.Fatalf("PostFilter %v, want UnschedulableAndUnresolvable (no preemption after it)", st)
	}
	if diff := cmp.Diff([]string{"ns/p"}, act.keys); diff != "" {
		t.Errorf("activated (-want +got):\n%s", diff)
	}

	state = framework.NewCycleState()
	res, st := p.PreFilter(ctx, state, pod, nodes)
	if !st.IsSuccess() || res.NodeNames.Len() != 3 || !core.all[1] {
		t.Fatalf("second cycle: %v %v (FilterAll %v), want every fitting node", res, st, core.all)
	}
	// Not narrowed any more: PostFilter leaves it to preemption.
	if _, st := p.PostFilter(ctx, state, pod, nil); st.Code() != fwk.Unschedulable {
		t.Errorf("PostFilter of a wide cycle: %v, want Unschedulable", st)
	}

	// Expiry.
	clk.SetTime(clk.Now().Add(wideFor + time.Second))
	if _, st := p.PreFilter(ctx, framework.NewCycleState(), pod, nodes); !st.IsSuccess() || core.all[2] {
		t.Errorf("after %s: FilterAll %v, want the shortlist again", wideFor, core.all)
	}

	// Reserve ends it.
	p.setWide(pod.UID)
	state = framework.NewCycleState()
	if _, st := p.PreFilter(ctx, state, pod, nodes); !st.IsSuccess() {
		t.Fatal(st)
	}
	if st := p.Reserve(ctx, state, pod, "n1"); !st.IsSuccess() {
		t.Fatal(st)
	}
	if p.isWide(pod.UID) {
		t.Error("still wide after Reserve")
	}
}

// A pod whose room is being freed (its victims still hold their devices,
// so NodeResourcesFit refuses the node Tessera passed) is not handed to
// DefaultPreemption, narrowed or not.
func TestPostFilterLeavesRoomBeingFreedAlone(t *testing.T) {
	for _, best := range []sets.Set[string]{nil, sets.New("n0")} {
		core := &fakeCore{fit: sets.New("n0", "n1"), best: best, freeing: true}
		p, act, _ := newPlugin(core)
		state := framework.NewCycleState()
		pod := gpuPod("p", 4)
		if _, st := p.PreFilter(context.Background(), state, pod, []fwk.NodeInfo{node("n0"), node("n1")}); !st.IsSuccess() {
			t.Fatal(st)
		}
		_, st := p.PostFilter(context.Background(), state, pod, nil)
		if st.Code() != fwk.UnschedulableAndUnresolvable || !strings.Contains(st.Message(), "being freed") {
			t.Errorf("shortlist %v: PostFilter %v, want UnschedulableAndUnresolvable (no DefaultPreemption after it)", best, st)
		}
		want := []string{"n0", "n1"}
		if best != nil {
			want = []string{"n0"}
		}
		if diff := cmp.Diff([][]string{want}, core.freeingAsked); diff != "" {
			t.Errorf("RoomBeingFreed asked about (-want +got):\n%s", diff)
		}
		if len(act.keys) != 0 {
			t.Errorf("activated %v", act.keys)
		}
	}
}

func TestPostFilterLeavesUnnarrowedToPreemption(t *testing.T) {
	core := &fakeCore{fit: sets.New("n0")}
	p, act, _ := newPlugin(core)
	state := framework.NewCycleState()
	pod := gpuPod("p", 1)
	if _, st := p.PreFilter(context.Background(), state, pod, []fwk.NodeInfo{node("n0")}); !st.IsSuccess() {
		t.Fatal(st)
	}
	if _, st := p.PostFilter(context.Background(), state, pod, nil); st.Code() != fwk.Unschedulable {
		t.Errorf("PostFilter %v, want Unschedulable", st)
	}
	if _, st := p.PostFilter(context.Background(), framework.NewCycleState(), cpuPod("c"), nil); st.Code() != fwk.Unschedulable {
		t.Errorf("PostFilter of a CPU-only pod %v, want Unschedulable", st)
	}
	if len(act.keys) != 0 {
		t.Errorf("activated %v", act.keys)
	}
}

func TestScores(t *testing.T) {
	core := &fakeCore{fit: sets.New("n0", "n1"), scores: map[string]int64{"n0": 3, "n1": 10}}
	p, _, _ := newPlugin(core)
	ctx := context.Background()
	nodes := []fwk.NodeInfo{node("n0"), node("n1")}
	for _, tc := range []struct {
		pod  *corev1.Pod
		want []int64
	}{
		{gpuPod("g", 1), []int64{30, 100}}, // x10: the GPU entry's weight
		{cpuPod("c"), []int64{3, 10}},      // as is: the CPU entry's, a tenth
	} {
		state := framework.NewCycleState()
		if _, st := p.PreFilter(ctx, state, tc.pod, nodes); !st.IsSuccess() && st.Code() != fwk.Skip {
			t.Fatal(st)
		}
		if st := p.PreScore(ctx, state, tc.pod, nodes); !st.IsSuccess() {
			t.Fatal(st)
		}
		var got []int64
		for _, ni := range nodes {
			s, st := p.Score(ctx, state, tc.pod, ni)
			if !st.IsSuccess() {
				t.Fatal(st)
			}
			got = append(got, s)
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("%s scores (-want +got):\n%s", tc.pod.Name, diff)
		}
	}
}

func TestReserveAndBind(t *testing.T) {
	core := &fakeCore{fit: sets.New("n0")}
	p, _, _ := newPlugin(core)
	ctx := context.Background()
	pod := gpuPod("p", 1)
	state := framework.NewCycleState()
	if _, st := p.PreFilter(ctx, state, pod, []fwk.NodeInfo{node("n0")}); !st.IsSuccess() {
		t.Fatal(st)
	}
	if st := p.Reserve(ctx, state, pod, "n0"); !st.IsSuccess() {
		t.Fatal(st)
	}
	if core.reserved[pod.UID] != "n0" {
		t.Errorf("reserved %v", core.reserved)
	}
	p.Unreserve(ctx, state, pod, "n0")
	if len(core.reserved) != 0 {
		t.Errorf("after Unreserve: %v", core.reserved)
	}
	if st := p.Bind(ctx, state, pod, "n0"); !st.IsSuccess() {
		t.Fatal(st)
	}
	if st := p.Bind(ctx, framework.NewCycleState(), cpuPod("c"), "n0"); st.Code() != fwk.Skip {
		t.Errorf("Bind of a CPU-only pod: %v, want Skip (DefaultBinder)", st)
	}
	if diff := cmp.Diff([]string{"p@n0"}, core.bound); diff != "" {
		t.Errorf("bound (-want +got):\n%s", diff)
	}

	core.reserveErr = errors.New("no room")
	if st := p.Reserve(ctx, state, pod, "n0"); st.Code() != fwk.Unschedulable || !strings.Contains(st.Message(), "no room") {
		t.Errorf("Reserve failing: %v", st)
	}
}

func TestManaged(t *testing.T) {
	mig := cpuPod("m")
	mig.Spec.InitContainers = []corev1.Container{{Name: "i", Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{api.MIGResource("1g.10gb"): resource.MustParse("1")}}}}
	for _, tc := range []struct {
		pod  *corev1.Pod
		want bool
	}{
		{gpuPod("g", 1), true},
		{cpuPod("c"), false},
		{mig, true},
	} {
		if got := managed(tc.pod); got != tc.want {
			t.Errorf("managed(%s) = %v, want %v", tc.pod.Name, got, tc.want)
		}
	}
}
