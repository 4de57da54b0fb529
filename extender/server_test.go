package extender

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/extender/internal/testbuild"
	"github.com/tessera-gpu/tessera/extender/verbs"
	"github.com/tessera-gpu/tessera/internal/podtrust"
)

// fakePods is an in-memory PodClient.
type fakePods struct {
	mu      sync.Mutex
	pods    map[string]*corev1.Pod
	bindErr error
	calls   []string
	// stale, when set, is what GetPod (the cached read) returns.
	stale map[string]*corev1.Pod
	// bindGate, when it has a pod's name, holds Bind of that pod (after
	// recording the call) until the channel is closed.
	bindGate map[string]chan struct{}
}

var _ PodClient = (*fakePods)(nil)

func newFakePods(pods ...*corev1.Pod) *fakePods {
	f := &fakePods{pods: map[string]*corev1.Pod{}}
	for _, p := range pods {
		f.pods[p.Namespace+"/"+p.Name] = p.DeepCopy()
	}
	return f
}

func (f *fakePods) GetPod(_ context.Context, ns, name string) (*corev1.Pod, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, ok := f.pods[ns+"/"+name]
	if sp, isStale := f.stale[ns+"/"+name]; isStale {
		p, ok = sp, true
	}
	if !ok {
		return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "pods"}, name)
	}
	return p.DeepCopy(), nil
}

func (f *fakePods) GetFreshPod(ctx context.Context, ns, name string) (*corev1.Pod, error) {
	f.mu.Lock()
	stale := f.stale
	f.stale = nil
	f.mu.Unlock()
	defer func() { f.mu.Lock(); f.stale = stale; f.mu.Unlock() }()
	return f.GetPod(ctx, ns, name)
}

// Bind binds as the API server does: an assignment goes onto the pod in
// the same write, which is then conditional on the resourceVersion.
func (f *fakePods) Bind(_ context.Context, pod *corev1.Pod, node, assignment string) error {
	f.mu.Lock()
	f.calls = append(f.calls, "bind "+pod.Name+" "+node)
	if gate := f.bindGate[pod.Name]; gate != nil {
		f.mu.Unlock()
		<-gate
		f.mu.Lock()
	}
	defer f.mu.Unlock()
	if f.bindErr != nil {
		return f.bindErr
	}
	p := f.pods[pod.Namespace+"/"+pod.Name]
	if assignment != "" && p.ResourceVersion != pod.ResourceVersion {
		return apierrors.NewConflict(schema.GroupResource{Resource: "pods"}, pod.Name, errors.New("resourceVersion changed"))
	}
	if p.Spec.NodeName != "" {
		return apierrors.NewConflict(schema.GroupResource{Resource: "pods"}, pod.Name, errors.New("already bound"))
	}
	p.Spec.NodeName = node
	if assignment != "" {
		if p.Annotations == nil {
			p.Annotations = map[string]string{}
		}
		p.Annotations[api.AnnotationAssignment] = assignment
	}
	p.ResourceVersion += "+"
	return nil
}

type fixture struct {
	cache  *Cache
	pods   *fakePods
	events *testbuild.Recorder
	reg    *prometheus.Registry
	srv    *httptest.Server
	server *Server
}

func newFixture(t *testing.T, nodes []*corev1.Node, bound []*corev1.Pod, pending ...*corev1.Pod) *fixture {
	t.Helper()
	f := &fixture{cache: newTestCache(t, nodes, bound), pods: newFakePods(pending...), events: &testbuild.Recorder{}, reg: prometheus.NewRegistry()}
	metrics := NewMetrics(f.reg)
	s := NewServer(f.cache, testPolicy(t, PolicyBinpack), f.pods, f.events, metrics)
	f.server = s
	mux := http.NewServeMux()
	(&verbs.Handler{Core: s, Trust: &podtrust.Filter{Sealer: testbuild.Sealer(t)}, Metrics: metrics}).Register(mux)
	f.srv = httptest.NewServer(mux)
	// Closing the connections first ends the requests of a handler that
	// still waits (a failed test), so Close does not block.
	t.Cleanup(func() { f.srv.CloseClientConnections(); f.srv.Close() })
	return f
}

func (f *fixture) post(t *testing.T, path string, body any, out any) int {
	t.Helper()
	var raw []byte
	switch b := body.(type) {
	case string:
		raw = []byte(b)
	default:
		var err error
		if raw, err = json.Marshal(body); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := http.Post(f.srv.URL+path, "application/json", bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("%s: Content-Type %q, want application/json", path, ct)
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		t.Fatalf("%s: reply is not JSON: %v", path, err)
	}
	return resp.StatusCode
}

func TestFilterVerb(t *testing.T) {
	nodes := []*corev1.Node{
		testbuild.Node("a100").GPUs(2, "NVIDIA A100-SXM4-40GB", 40960).Obj(),
		testbuild.Node("h100").GPUs(2, "NVIDIA H100 80GB HBM3", 81920).Obj(),
		testbuild.Node("cpu").Obj(),
	}
	bound := []*corev1.Pod{testbuild.Pod("a").Shared(40, 10).Node("a100").On(0, 40960, 10).Obj()}
	f := newFixture(t, nodes, bound)
	pod := testbuild.Pod("p").Whole(2).Model("A100|V100").Obj()
	names := []string{"a100", "h100", "cpu", "ghost"}

	var res extenderv1.ExtenderFilterResult
	if code := f.post(t, verbs.PathFilter, &extenderv1.ExtenderArgs{Pod: pod, NodeNames: &names}, &res); code != http.StatusOK {
		t.Fatalf("status %d", code)
	}
	if res.NodeNames == nil || len(*res.NodeNames) != 0 {
		t.Errorf("NodeNames = %v, want empty", res.NodeNames)
	}
	gotReasons := map[string]string{}
	for n, m := range res.FailedNodes {
		gotReasons[n] = "resolvable: " + m[:strings.Index(m, ":")]
	}
	for n, m := range res.FailedAndUnresolvableNodes {
		gotReasons[n] = "unresolvable: " + m[:strings.Index(m, ":")]
	}
	want := map[string]string{"a100": "resolvable: tessera", "h100": "unresolvable: tessera", "cpu": "unresolvable: tessera", "ghost": "resolvable: tessera"}
	if diff := cmp.Diff(want, gotReasons); diff != "" {
		t.Errorf("failed nodes (-want +got):\n%s", diff)
	}
	if !strings.Contains(res.FailedAndUnresolvableNodes["h100"], "H100") {
		t.Errorf("model message %q does not name the model", res.FailedAndUnresolvableNodes["h100"])
	}
	if got := testbuild.Counter(t, f.reg, "rejections", string(ModelNotAllowed)); got != 1 {
		t.Errorf("rejections{%s} = %v, want 1", ModelNotAllowed, got)
	}

	// Full Nodes mode: a shared pod fits the H100 (and the A100's free GPU).
	shared := testbuild.Pod("s").Shared(20, 0).Obj()
	list := &corev1.NodeList{Items: []corev1.Node{*nodes[0], *nodes[1], *nodes[2]}}
	res = extenderv1.ExtenderFilterResult{}
	f.post(t, verbs.PathFilter, &extenderv1.ExtenderArgs{Pod: shared, Nodes: list}, &res)
	var got []string
	for _, n := range res.Nodes.Items {
		got = append(got, n.Name)
	}
	if diff := cmp.Diff([]string{"a100", "h100"}, got); diff != "" {
		t.Errorf("Nodes (-want +got):\n%s", diff)
	}
}

func TestMalformedRequests(t *testing.T) {
	f := newFixture(t, []*corev1.Node{testbuild.Node("n").GPUs(1, "A100", 40960).Obj()}, nil)
	for _, path := range []string{verbs.PathFilter, verbs.PathPrioritize, verbs.PathPrioritizeCPU, verbs.PathBind, verbs.PathPreempt} {
		t.Run(path, func(t *testing.T) {
			var reply map[string]any
			code := f.post(t, path, `{"Pod": [`, &reply)
			if code != http.StatusBadRequest {
				t.Errorf("status %d, want 400", code)
			}
			msg, _ := reply["Error"].(string)
			if m, ok := reply["error"].(string); ok {
				msg = m
			}
			if !strings.Contains(msg, "malformed request body") {
				t.Errorf("reply %v has no error message", reply)
			}
		})
	}
	// A malformed pod annotation: a JSON error and an Event.
	names := []string{"n"}
	bad := testbuild.Pod("bad").Whole(1).Model("|").Obj()
	var res extenderv1.ExtenderFilterResult
	f.post(t, verbs.PathFilter, &extenderv1.ExtenderArgs{Pod: bad, NodeNames: &names}, &res)
	if !strings.Contains(res.Error, api.AnnotationGPUModel) {
		t.Errorf("Error = %q, want it to name %s", res.Error, api.AnnotationGPUModel)
	}
	if len(f.events.Events) != 1 || !strings.HasPrefix(f.events.Events[0], "InvalidGPURequest") {
		t.Errorf("events = %v, want one InvalidGPURequest", f.events.Events)
	}
	// No pod at all.
	res = extenderv1.ExtenderFilterResult{}
	f.post(t, verbs.PathFilter, &extenderv1.ExtenderArgs{NodeNames: &names}, &res)
	if res.Error == "" {
		t.Error("filter without a pod: no error")
	}
}

func TestPrioritizeVerb(t *testing.T) {
	nodes := []*corev1.Node{testbuild.Node("empty").GPUs(8, "A100", 40960).Obj(), testbuild.Node("used").GPUs(8, "A100", 40960).Obj(), testbuild.Node("full").GPUs(1, "A100", 40960).Obj()}
	bound := []*corev1.Pod{
		testbuild.Pod("a").Shared(10, 50).Node("used").On(0, 10240, 50).Obj(),
		testbuild.Pod("b").Whole(1).Node("full").Holding(0).Obj(),
	}
	f := newFixture(t, nodes, bound)
	names := []string{"empty", "used", "full"}
	var got extenderv1.HostPriorityList
	f.post(t, verbs.PathPrioritize, &extenderv1.ExtenderArgs{Pod: testbuild.Pod("p").Shared(10, 25).Obj(), NodeNames: &names}, &got)
	want := extenderv1.HostPriorityList{{Host: "empty", Score: 0}, {Host: "used", Score: 10}, {Host: "full", Score: 0}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("prioritize (-want +got):\n%s", diff)
	}
	// Full Nodes mode scores the same.
	got = nil
	list := &corev1.NodeList{Items: []corev1.Node{*nodes[0], *nodes[1], *nodes[2]}}
	f.post(t, verbs.PathPrioritize, &extenderv1.ExtenderArgs{Pod: testbuild.Pod("p").Shared(10, 25).Obj(), Nodes: list}, &got)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("prioritize with Nodes (-want +got):\n%s", diff)
	}
	// The CPU-only entry leaves GPU pods alone.
	got = nil
	f.post(t, verbs.PathPrioritizeCPU, &extenderv1.ExtenderArgs{Pod: testbuild.Pod("p").Shared(10, 25).Obj(), NodeNames: &names}, &got)
	for _, hp := range got {
		if hp.Score != 0 {
			t.Errorf("prioritize-cpu scored a GPU pod: %v", got)
		}
	}
}

// TestCPUOnlyPodsAvoidStrandingGPUs checks that a CPU-only pod prefers a
// node without GPUs over one whose GPUs its CPU would strand.
func TestCPUOnlyPodsAvoidStrandingGPUs(t *testing.T) {
	nodes := []*corev1.Node{testbuild.Node("gpu").GPUs(8, "A100", 40960).CPU("64").Obj(), testbuild.Node("plain").CPU("64").Obj()}
	f := newFixture(t, nodes, nil)
	names := []string{"gpu", "plain"}
	var got extenderv1.HostPriorityList
	f.post(t, verbs.PathPrioritizeCPU, &extenderv1.ExtenderArgs{Pod: testbuild.Pod("c").CPU("48").Obj(), NodeNames: &names}, &got)
	if len(got) != 2 || got[1].Score <= got[0].Score {
		t.Errorf("prioritize-cpu = %v, want plain above gpu", got)
	}
}

func TestBindVerb(t *testing.T) {
	node := testbuild.Node("n").GPUs(2, "A100", 40960).Obj()
	bound := []*corev1.Pod{testbuild.Pod("a").Shared(10, 50).Node("n").On(1, 10240, 50).Obj()}
	pod := testbuild.Pod("p").Shared(10, 25).Obj()
	f := newFixture(t, []*corev1.Node{node}, bound, pod)
	args := &extenderv1.ExtenderBindingArgs{PodNamespace: "default", PodName: "p", PodUID: pod.UID, Node: "n"}

	var res extenderv1.ExtenderBindingResult
	f.post(t, verbs.PathBind, args, &res)
	if res.Error != "" {
		t.Fatalf("bind error %q", res.Error)
	}
	got, _ := f.pods.GetPod(context.Background(), "default", "p")
	a, ok, err := api.GetAssignment(got.Annotations)
	if err != nil || !ok {
		t.Fatalf("assignment: ok=%v err=%v", ok, err)
	}
	want := &api.Assignment{APIVersion: api.Version, Kind: api.KindAssignment, Containers: []api.ContainerAssignment{{Name: "main",
		Shared: &api.SharedGPU{GPU: api.GPURef{UUID: testbuild.GPUUUID("n", 1), Index: 1}, MemoryMiB: 10240, Cores: 25}}}}
	if diff := cmp.Diff(want, a); diff != "" {
		t.Errorf("assignment (-want +got):\n%s", diff)
	}
	if got.Spec.NodeName != "n" {
		t.Errorf("pod bound to %q", got.Spec.NodeName)
	}
	// One write: the Binding carries the assignment.
	if diff := cmp.Diff([]string{"bind p n"}, f.pods.calls); diff != "" {
		t.Errorf("API calls (-want +got):\n%s", diff)
	}
	// Counted before the informer shows it.
	if free := freeOf(mustState(t, f.cache, "n")); free != "1000/40960 250/20480" {
		t.Errorf("free after bind = %q", free)
	}
	// A retry is a no-op.
	res = extenderv1.ExtenderBindingResult{}
	f.post(t, verbs.PathBind, args, &res)
	if res.Error != "" || len(f.pods.calls) != 1 {
		t.Errorf("retry: error %q, calls %v", res.Error, f.pods.calls)
	}
}

// A whole-GPU pod reserved on a node after a slice put on a free GPU of
// that node is bound only after the slice: the node agent must see the
// slice's GPU before the kubelet chooses the whole-GPU pod's GPUs.
func TestBindOrdersWholeAfterEarlierSlices(t *testing.T) {
	node := testbuild.Node("n").GPUs(4, "A100", 40960).Obj()
	slice := testbuild.Pod("s").Shared(10, 25).Obj()
	whole := testbuild.Pod("w").Whole(2).Obj()
	other := testbuild.Pod("o").Shared(10, 25).Obj()
	f := newFixture(t, []*corev1.Node{node, testbuild.Node("m").GPUs(4, "A100", 40960).Obj()}, nil, slice, whole, other)
	sGate, oGate := make(chan struct{}), make(chan struct{})
	var sOpen, oOpen sync.Once
	openS, openO := func() { sOpen.Do(func() { close(sGate) }) }, func() { oOpen.Do(func() { close(oGate) }) }
	// Registered after the fixture's, so it runs first: a failed test
	// leaves no handler blocked.
	t.Cleanup(func() { openS(); openO() })
	f.pods.bindGate = map[string]chan struct{}{"s": sGate, "o": oGate}
	bind := func(p *corev1.Pod, node string) <-chan string {
		done := make(chan string, 1)
		go func() {
			var res extenderv1.ExtenderBindingResult
			f.post(t, verbs.PathBind, &extenderv1.ExtenderBindingArgs{PodNamespace: "default", PodName: p.Name, PodUID: p.UID, Node: node}, &res)
			done <- res.Error
		}()
		return done
	}
	calls := func() []string {
		f.pods.mu.Lock()
		defer f.pods.mu.Unlock()
		return append([]string(nil), f.pods.calls...)
	}
	waitCall := func(call string) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !slices.Contains(calls(), call); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("no %q call: %v", call, calls())
			}
		}
	}
	sDone := bind(slice, "n")
	waitCall("bind s n") // reserved, its Binding being written
	oDone := bind(other, "m")
	waitCall("bind o m")
	wDone := bind(whole, "n")
	// The whole-GPU pod waits for the slice of its node, not for the
	// slice of another node.
	select {
	case err := <-wDone:
		t.Fatalf("whole-GPU pod bound (error %q) while a slice reserved before it on its node was not: %v", err, calls())
	case <-time.After(200 * time.Millisecond):
	}
	openS()
	for _, done := range []<-chan string{sDone, wDone} {
		if err := <-done; err != "" {
			t.Fatalf("bind: %s", err)
		}
	}
	got := calls()
	openO()
	if err := <-oDone; err != "" {
		t.Fatalf("bind o: %s", err)
	}
	if i, j := slices.Index(got, "bind s n"), slices.Index(got, "bind w n"); i < 0 || j < i {
		t.Errorf("API calls %v: want the slice's Binding before the whole-GPU pod's", got)
	}
	if f.cache.Reservations() != 3 {
		t.Errorf("reservations = %d, want 3", f.cache.Reservations())
	}
}

// With Reserve (tessera-scheduler reserves in its scheduling cycle and
// binds later, binds running concurrently), a slice counts as in flight
// from its reservation: a whole-GPU pod reserved after it on its node is
// bound after it even when its bind starts first. Unreserve ends it.
func TestReservedSliceOrdersLaterWholeBinds(t *testing.T) {
	node := testbuild.Node("n").GPUs(4, "A100", 40960).Obj()
	slice := testbuild.Pod("s").Shared(10, 25).Obj()
	whole := testbuild.Pod("w").Whole(2).Obj()
	dropped := testbuild.Pod("d").Shared(10, 25).Obj()
	whole2 := testbuild.Pod("w2").Whole(1).Obj()
	f := newFixture(t, []*corev1.Node{node}, nil, slice, whole, dropped, whole2)
	ctx := context.Background()
	sGate := make(chan struct{})
	var sOpen sync.Once
	openS := func() { sOpen.Do(func() { close(sGate) }) }
	t.Cleanup(openS)
	f.pods.bindGate = map[string]chan struct{}{"s": sGate}
	for _, p := range []*corev1.Pod{slice, whole} {
		if err := f.server.Reserve(p, "n"); err != nil {
			t.Fatal(err)
		}
	}
	bind := func(p *corev1.Pod) <-chan error {
		done := make(chan error, 1)
		go func() {
			done <- f.server.Bind(ctx, &extenderv1.ExtenderBindingArgs{PodNamespace: "default", PodName: p.Name, PodUID: p.UID, Node: "n"})
		}()
		return done
	}
	wDone := bind(whole) // before the slice's bind has even started
	select {
	case err := <-wDone:
		t.Fatalf("whole-GPU pod bound (error %v) before the slice reserved before it", err)
	case <-time.After(200 * time.Millisecond):
	}
	sDone := bind(slice)
	select {
	case err := <-sDone:
		t.Fatalf("the slice's bind ended (error %v) while held", err)
	case err := <-wDone:
		f.pods.mu.Lock()
		c := append([]string(nil), f.pods.calls...)
		f.pods.mu.Unlock()
		t.Fatalf("whole-GPU pod bound (error %v) while the slice's bind is held: %v", err, c)
	case <-time.After(100 * time.Millisecond):
	}
	openS()
	for _, done := range []<-chan error{sDone, wDone} {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	f.pods.mu.Lock()
	got := append([]string(nil), f.pods.calls...)
	f.pods.mu.Unlock()
	if i, j := slices.Index(got, "bind s n"), slices.Index(got, "bind w n"); i < 0 || j < i {
		t.Errorf("API calls %v: want the slice's Binding before the whole-GPU pod's", got)
	}

	// A reserved slice that is unreserved holds nothing back.
	if err := f.server.Reserve(dropped, "n"); err != nil {
		t.Fatal(err)
	}
	if err := f.server.Reserve(whole2, "n"); err != nil {
		t.Fatal(err)
	}
	f.server.Unreserve(dropped.UID)
	select {
	case err := <-bind(whole2):
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a whole-GPU bind waited for an unreserved slice")
	}
}

func TestBindRollsBackAndRetries(t *testing.T) {
	node := testbuild.Node("n").GPUs(2, "A100", 40960).Obj()
	bound := []*corev1.Pod{testbuild.Pod("a").Shared(10, 50).Node("n").On(1, 10240, 50).Obj()}
	pod := testbuild.Pod("p").Shared(10, 25).Obj()
	f := newFixture(t, []*corev1.Node{node}, bound, pod)
	args := &extenderv1.ExtenderBindingArgs{PodNamespace: "default", PodName: "p", PodUID: pod.UID, Node: "n"}
	f.pods.bindErr = errors.New("apiserver unavailable")
	var res extenderv1.ExtenderBindingResult
	f.post(t, verbs.PathBind, args, &res)
	if !strings.Contains(res.Error, "apiserver unavailable") {
		t.Fatalf("bind error %q", res.Error)
	}
	if free := freeOf(mustState(t, f.cache, "n")); free != "1000/40960 500/30720" {
		t.Errorf("ledger not rolled back: %q", free)
	}
	if f.cache.Reservations() != 0 {
		t.Error("reservation left after failed binding")
	}
	// The failed Binding carried the assignment: nothing was written.
	if p, _ := f.pods.GetFreshPod(context.Background(), "default", "p"); p.Annotations[api.AnnotationAssignment] != "" || p.Spec.NodeName != "" {
		t.Errorf("failed bind left the pod with node %q, assignment %q", p.Spec.NodeName, p.Annotations[api.AnnotationAssignment])
	}
	f.pods.bindErr = nil
	res = extenderv1.ExtenderBindingResult{}
	f.post(t, verbs.PathBind, args, &res)
	if res.Error != "" {
		t.Fatalf("retry: %q", res.Error)
	}
	if diff := cmp.Diff([]string{"bind p n", "bind p n"}, f.pods.calls); diff != "" {
		t.Errorf("API calls (-want +got):\n%s", diff)
	}
	// The retry placed it where the first try would have: the GPU the
	// other slice shares.
	got, _ := f.pods.GetFreshPod(context.Background(), "default", "p")
	if a, ok, err := api.GetAssignment(got.Annotations); err != nil || !ok || a.Containers[0].Shared.GPU.Index != 1 {
		t.Errorf("assignment after the retry: %v (ok %v, err %v), want GPU 1", a, ok, err)
	}
}

func TestBindErrors(t *testing.T) {
	node := testbuild.Node("n").GPUs(1, "A100", 40960).Obj()
	full := []*corev1.Pod{testbuild.Pod("a").Shared(40, 50).Node("n").On(0, 40960, 50).Obj()}
	pod := testbuild.Pod("p").Shared(10, 25).Obj()
	f := newFixture(t, []*corev1.Node{node}, full, pod)
	tests := []struct {
		name string
		args extenderv1.ExtenderBindingArgs
		want string
	}{
		{"unknown pod", extenderv1.ExtenderBindingArgs{PodNamespace: "default", PodName: "ghost", Node: "n"}, "not found"},
		{"recreated pod", extenderv1.ExtenderBindingArgs{PodNamespace: "default", PodName: "p", PodUID: "other", Node: "n"}, ErrPodMismatch.Error()},
		{"no longer fits", extenderv1.ExtenderBindingArgs{PodNamespace: "default", PodName: "p", PodUID: pod.UID, Node: "n"}, "does not fit"},
		{"unknown node", extenderv1.ExtenderBindingArgs{PodNamespace: "default", PodName: "p", PodUID: pod.UID, Node: "x"}, ErrNoNode.Error()},
		{"empty", extenderv1.ExtenderBindingArgs{}, "required"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var res extenderv1.ExtenderBindingResult
			f.post(t, verbs.PathBind, &tc.args, &res)
			if !strings.Contains(res.Error, tc.want) {
				t.Errorf("Error = %q, want it to contain %q", res.Error, tc.want)
			}
		})
	}
	if len(f.pods.calls) != 0 {
		t.Errorf("API writes on failed binds: %v", f.pods.calls)
	}
}

func TestPreemptVerb(t *testing.T) {
	node := testbuild.Node("n").GPUs(2, "A100", 40960).Obj()
	bound := []*corev1.Pod{
		testbuild.Pod("g0").Shared(40, 50).Node("n").On(0, 40960, 50).Obj(),
		testbuild.Pod("g1").Shared(40, 50).Node("n").On(1, 40960, 50).Priority(5).Obj(),
	}
	f := newFixture(t, []*corev1.Node{node}, bound)
	args := &extenderv1.ExtenderPreemptionArgs{
		Pod: testbuild.Pod("p").Shared(30, 0).Obj(),
		NodeNameToMetaVictims: map[string]*extenderv1.MetaVictims{
			"n":     {Pods: []*extenderv1.MetaPod{{UID: "uid-g0"}, {UID: "uid-g1"}}, NumPDBViolations: 1},
			"ghost": {Pods: []*extenderv1.MetaPod{{UID: "x"}}},
		},
	}
	var res extenderv1.ExtenderPreemptionResult
	if code := f.post(t, verbs.PathPreempt, args, &res); code != http.StatusOK {
		t.Fatalf("status %d", code)
	}
	want := map[string]*extenderv1.MetaVictims{"n": {Pods: []*extenderv1.MetaPod{{UID: "uid-g0"}}, NumPDBViolations: 1}}
	if diff := cmp.Diff(want, res.NodeNameToMetaVictims); diff != "" {
		t.Errorf("preempt (-want +got):\n%s", diff)
	}
}

// A pod that fits a node's GPUs as they are (kube-scheduler's count says
// otherwise while a GPU is not offered again yet, or pods leave): no node
// is a candidate, neither that one with no victims (kube-scheduler fails
// its whole preemption on "expected at least one victim pod", seen on
// make demo) nor another, which would evict for nothing.
func TestPreemptVerbNothingWhereThePodFits(t *testing.T) {
	free := testbuild.Node("free").GPUs(2, "A100", 40960).Obj()
	full := testbuild.Node("full").GPUs(1, "A100", 40960).Obj()
	bound := []*corev1.Pod{
		testbuild.Pod("a").Whole(1).Node("free").Holding(0).Obj(),
		testbuild.Pod("b").Whole(1).Node("full").Holding(0).Obj(),
	}
	f := newFixture(t, []*corev1.Node{free, full}, bound)
	args := &extenderv1.ExtenderPreemptionArgs{
		Pod: testbuild.Pod("p").Whole(1).Priority(100).Obj(),
		NodeNameToMetaVictims: map[string]*extenderv1.MetaVictims{
			"free": {Pods: []*extenderv1.MetaPod{{UID: "uid-a"}}},
			"full": {Pods: []*extenderv1.MetaPod{{UID: "uid-b"}}},
		},
	}
	var res extenderv1.ExtenderPreemptionResult
	if code := f.post(t, verbs.PathPreempt, args, &res); code != http.StatusOK {
		t.Fatalf("status %d", code)
	}
	if len(res.NodeNameToMetaVictims) != 0 {
		t.Errorf("candidates %v, want none", res.NodeNameToMetaVictims)
	}
}

// TestBindStaleCacheNeverOverwrites checks that a bind working from a
// stale cached pod (it was bound elsewhere meanwhile) does not touch the
// pod's assignment and fails.
func TestBindStaleCacheNeverOverwrites(t *testing.T) {
	node := testbuild.Node("n").GPUs(1, "A100", 40960).Obj()
	pod := testbuild.Pod("p").Shared(10, 25).Obj()
	pod.ResourceVersion = "1"
	boundElsewhere := testbuild.Pod("p").Shared(10, 25).Node("m").On(0, 10240, 25).Obj()
	boundElsewhere.ResourceVersion = "2"
	f := newFixture(t, []*corev1.Node{node}, nil, boundElsewhere)
	f.pods.stale = map[string]*corev1.Pod{"default/p": pod}
	var res extenderv1.ExtenderBindingResult
	f.post(t, verbs.PathBind, &extenderv1.ExtenderBindingArgs{PodNamespace: "default", PodName: "p", PodUID: pod.UID, Node: "n"}, &res)
	if !strings.Contains(res.Error, ErrPodMismatch.Error()) {
		t.Errorf("Error = %q, want %v", res.Error, ErrPodMismatch)
	}
	got, _ := f.pods.GetFreshPod(context.Background(), "default", "p")
	if diff := cmp.Diff(boundElsewhere.Annotations, got.Annotations); diff != "" {
		t.Errorf("annotations changed (-want +got):\n%s", diff)
	}
	if f.cache.Reservations() != 0 {
		t.Error("reservation left behind")
	}
	if diff := cmp.Diff([]string{"bind p n"}, f.pods.calls); diff != "" {
		t.Errorf("API calls (-want +got):\n%s", diff)
	}
}

// TestBindStaleCacheRetriesFresh: a cached pod older than the API server's
// (a label changed since, say) makes the Binding, conditional on the
// resourceVersion read, a Conflict; the bind then decides again from a
// fresh read and binds.
// A gang member the planner just planned and released, bound by
// kube-scheduler from a newer copy than the extender's cache (which shows
// no plan yet): the bind reads the pod afresh and binds it.
func TestBindStaleCacheWithoutThePlanRetriesFresh(t *testing.T) {
	node := testbuild.Node("n").GPUs(1, "A100", 40960).Obj()
	pod := testbuild.Pod("p").Whole(1).Obj()
	pod.ResourceVersion = "1"
	pod.Annotations = map[string]string{api.AnnotationGang: "g", api.AnnotationGangMinMember: "1"}
	planned := pod.DeepCopy()
	planned.ResourceVersion = "2"
	if err := api.SetGangPlan(planned.Annotations, api.GangPlan{Gang: "g", Node: "n", Expires: time.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	if _, got := bindOverStaleCache(t, node, pod, planned); got.Spec.NodeName != "n" {
		t.Errorf("pod bound to %q, want n", got.Spec.NodeName)
	}
}

// bindOverStaleCache binds pod default/p to node n while the extender's
// cache shows stale and the API server fresh; it fails the test on a bind
// error and returns the fixture and the API server's pod after the bind.
func bindOverStaleCache(t *testing.T, node *corev1.Node, stale, fresh *corev1.Pod) (*fixture, *corev1.Pod) {
	t.Helper()
	f := newFixture(t, []*corev1.Node{node}, nil, fresh)
	f.pods.stale = map[string]*corev1.Pod{"default/p": stale}
	var res extenderv1.ExtenderBindingResult
	f.post(t, verbs.PathBind, &extenderv1.ExtenderBindingArgs{PodNamespace: "default", PodName: "p", PodUID: stale.UID, Node: "n"}, &res)
	if res.Error != "" {
		t.Fatalf("bind error %q", res.Error)
	}
	got, _ := f.pods.GetFreshPod(context.Background(), "default", "p")
	return f, got
}

func TestBindStaleCacheRetriesFresh(t *testing.T) {
	node := testbuild.Node("n").GPUs(1, "A100", 40960).Obj()
	pod := testbuild.Pod("p").Shared(10, 25).Obj()
	pod.ResourceVersion = "1"
	relabelled := pod.DeepCopy()
	relabelled.ResourceVersion = "2"
	relabelled.Labels = map[string]string{"team": "a"}
	f, got := bindOverStaleCache(t, node, pod, relabelled)
	if _, ok, err := api.GetAssignment(got.Annotations); err != nil || !ok || got.Spec.NodeName != "n" {
		t.Errorf("pod bound to %q, assignment ok %v err %v", got.Spec.NodeName, ok, err)
	}
	if diff := cmp.Diff([]string{"bind p n", "bind p n"}, f.pods.calls); diff != "" {
		t.Errorf("API calls (-want +got):\n%s", diff)
	}
	if f.cache.Reservations() != 1 {
		t.Errorf("reservations = %d, want 1 (the second bind's)", f.cache.Reservations())
	}
}

// The filter's message for a node whose GPUs pods planned there hold
// names them, and only on that node: messages are shared among the nodes
// of a model, but not this one.
func TestFilterNamesPlannedHoldsPerNode(t *testing.T) {
	nodes := []*corev1.Node{testbuild.Node("n1").GPUs(8, "A100", 40960).Obj(), testbuild.Node("n2").GPUs(8, "A100", 40960).Obj()}
	planned := testbuild.Pod("ring-0").Whole(8).Obj()
	if err := api.SetGangPlan(planned.Annotations, api.GangPlan{Gang: "ring", Node: "n1", Expires: time.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	planned.Annotations[api.AnnotationGang] = "ring"
	full := testbuild.Pod("full").Whole(8).Node("n2").Holding(0, 1, 2, 3, 4, 5, 6, 7).Obj()
	c := newTestCache(t, nodes, []*corev1.Pod{planned, full})
	s := NewServer(c, testPolicy(t, PolicyBinpack), newFakePods(), nil, nil)
	names := []string{"n1", "n2"}
	res := s.FilterArgs(context.Background(), &extenderv1.ExtenderArgs{Pod: testbuild.Pod("asker").Whole(1).Obj(), NodeNames: &names})
	if got := res.FailedNodes["n1"]; !strings.Contains(got, "8 held for pods planned here") || !strings.Contains(got, "default/ring-0") {
		t.Errorf("n1: %q, want the planned holds named", got)
	}
	if got := res.FailedNodes["n2"]; strings.Contains(got, "planned here") {
		t.Errorf("n2: %q names holds it does not have", got)
	}
}
