package extender

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/tessera-gpu/tessera/allocator"
	"github.com/tessera-gpu/tessera/extender/internal/testbuild"
)

func mustLearned(t *testing.T, window, every, min int) *LearnedPolicy {
	t.Helper()
	p, err := NewLearnedPolicy(PolicyBinpack, 1, window, every, min)
	if err != nil {
		t.Fatal(err)
	}
	l, ok := p.(*LearnedPolicy)
	if !ok {
		t.Fatalf("NewLearnedPolicy(binpack) = %T, want *LearnedPolicy", p)
	}
	return l
}

// TestLearnedPolicyRebuilds checks when the learned workload is built:
// not before min pods, at min, then every every new pods; a pod is
// counted once; the window keeps the last pods.
func TestLearnedPolicyRebuilds(t *testing.T) {
	l := mustLearned(t, 4, 2, 3)
	first := l.Current()
	whole := allocator.Request{CPUMilli: 8000, GPUs: 1}
	var rebuilt []bool
	for i, uid := range []string{"a", "b", "a", "c", "d", "e", "f", "g"} {
		ok, err := l.Observe(types.UID(uid), whole)
		if err != nil {
			t.Fatalf("pod %d: %v", i, err)
		}
		rebuilt = append(rebuilt, ok)
	}
	// a, b, a again (not counted), c: min reached, d, e: 2 since, f, g: 2 since.
	if diff := gocmp.Diff([]bool{false, false, false, true, false, true, false, true}, rebuilt); diff != "" {
		t.Errorf("rebuilt (-want +got):\n%s", diff)
	}
	if l.Current() == first {
		t.Error("the policy was not replaced")
	}
	if got := l.Shapes(); got != 4 {
		t.Errorf("Shapes = %d, want the window, 4", got)
	}
	// a left the window: it counts again.
	if _, err := l.Observe("a", whole); err != nil {
		t.Fatal(err)
	}
	if l.since != 1 {
		t.Errorf("a pod that left the window was not counted again (since = %d)", l.since)
	}
}

// TestLearnedPolicyNeedsNoWorkload: policies without a target workload
// are built as NewPolicy builds them; bad sizes are refused.
func TestLearnedPolicyNeedsNoWorkload(t *testing.T) {
	p, err := NewLearnedPolicy(allocator.PolicyBestFit, 1, 10, 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := p.(*LearnedPolicy); ok {
		t.Error("bestfit needs no workload, yet got a LearnedPolicy")
	}
	if _, err := NewLearnedPolicy(PolicyBinpack, 1, 0, 1, 1); err == nil {
		t.Error("window 0: want an error")
	}
}

// TestLearnedPolicyScoresAreNotStale checks that memoised scores follow
// the learned policy: after a rebuild Query.Score gives the new policy's
// score on the same node state.
func TestLearnedPolicyScoresAreNotStale(t *testing.T) {
	c := newTestCache(t, []*corev1.Node{testbuild.Node("n").GPUs(8, "A100", 40960).Obj()},
		[]*corev1.Pod{testbuild.Pod("w").Whole(3).Node("n").Holding(0, 1, 2).Obj()})
	st := mustState(t, c, "n")
	pod := testbuild.Pod("p").Whole(1).CPU("2").Obj()
	d, err := ParseDemand(pod)
	if err != nil {
		t.Fatal(err)
	}
	l := mustLearned(t, 100, 10, 10)
	q := NewQuery(&d)
	before, ok := q.Score(l, st)
	if !ok {
		t.Fatal("the pod does not fit")
	}
	// Only 4-GPU pods from now on: a 1-GPU pod on a node with 5 free GPUs
	// leaves 4, which the workload needs; the score changes.
	for i := range 10 {
		if _, err := l.Observe(types.UID(fmt.Sprint(i)), allocator.Request{CPUMilli: 4000, GPUs: 4}); err != nil {
			t.Fatal(err)
		}
	}
	after, _ := q.Score(l, st)
	req := d.Request(st.Info.UnitMiB, st.Info.SliceBaseMiB)
	want := l.Current().Evaluate(st.viewForDemand(&d), req).Score
	if after != want {
		t.Errorf("score after the rebuild = %v, want the new policy's %v (before: %v)", after, want, before)
	}
	if after == before {
		t.Fatalf("the rebuild did not change the score (%v): the case does not test staleness", before)
	}
}

// TestLearnedRequest lists the shape a pod adds to the learned workload.
func TestLearnedRequest(t *testing.T) {
	c := newTestCache(t, []*corev1.Node{testbuild.Node("n").GPUs(8, "A100", 40960).Obj()}, nil)
	memOnly := func(node string) *corev1.Pod {
		p := testbuild.Pod("m").Shared(10, 0).CPU("1").Node(node).Obj()
		return p
	}
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		want allocator.Request
		ok   bool
	}{
		{name: "whole", pod: testbuild.Pod("w").Whole(2).CPU("8").Obj(), want: allocator.Request{CPUMilli: 8000, GPUs: 2}, ok: true},
		{name: "slice with cores, pending", pod: testbuild.Pod("s").Shared(10, 30).CPU("2").Obj(), want: allocator.Request{CPUMilli: 2000, GPUMilli: 300}, ok: true},
		{name: "memory-only slice, bound", pod: memOnly("n"), want: allocator.Request{CPUMilli: 1000, GPUMilli: 250}, ok: true},
		{name: "memory-only slice, pending", pod: memOnly("")},
		{name: "cpu only", pod: testbuild.Pod("c").CPU("1").Obj()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := learnedRequest(tc.pod, c.Node)
			if ok != tc.ok {
				t.Fatalf("ok = %v, want %v", ok, tc.ok)
			}
			if diff := gocmp.Diff(tc.want, got); ok && diff != "" {
				t.Errorf("request (-want +got):\n%s", diff)
			}
		})
	}
}

// TestMostPopular keeps the n most frequent shapes, renormalised.
func TestMostPopular(t *testing.T) {
	shape := func(cpu int64, f float64) allocator.Shape {
		return allocator.Shape{Request: allocator.Request{CPUMilli: cpu, GPUs: 1}, Freq: f}
	}
	w := allocator.Workload{Shapes: []allocator.Shape{shape(1, 0.1), shape(2, 0.5), shape(3, 0.15), shape(4, 0.25)}}
	got := mostPopular(w, 2)
	want := allocator.Workload{Shapes: []allocator.Shape{shape(2, 0.5/0.75), shape(4, 0.25/0.75)}}
	if diff := gocmp.Diff(want, got); diff != "" {
		t.Errorf("mostPopular (-want +got):\n%s", diff)
	}
	if err := got.Validate(); err != nil {
		t.Error(err)
	}
	if diff := gocmp.Diff(w, mostPopular(w, 4)); diff != "" {
		t.Errorf("n = len: changed (-want +got):\n%s", diff)
	}
}

// learnInformer is an informer whose events the test delivers.
type learnInformer struct {
	h      toolscache.ResourceEventHandler
	synced atomic.Bool
}

func (f *learnInformer) AddEventHandler(h toolscache.ResourceEventHandler) (toolscache.ResourceEventHandlerRegistration, error) {
	f.h = h
	return f, nil
}

func (f *learnInformer) HasSynced() bool { return f.synced.Load() }

// TestLearnBuildsOnceTheFirstListIsIn checks that the pods of the
// informer's first list are counted without a rebuild each, the policy is
// built once the list is in, and later pods rebuild it every Every.
func TestLearnBuildsOnceTheFirstListIsIn(t *testing.T) {
	c := newTestCache(t, nil, nil)
	l := mustLearned(t, 1000, 10, 10)
	inf := &learnInformer{}
	if err := l.Learn(t.Context(), inf, c); err != nil {
		t.Fatal(err)
	}
	first := l.Current()
	pod := func(i int) *corev1.Pod {
		p := testbuild.Pod(fmt.Sprint("p", i)).Whole(1).CPU("4").Obj()
		p.UID = types.UID(p.Name)
		return p
	}
	for i := range 35 {
		inf.h.OnAdd(pod(i), true)
	}
	if l.Current() != first || l.Shapes() != 35 || l.Decided() {
		t.Fatalf("during the first list: policy replaced %v, %d pods counted, decided %v; want not replaced, 35, not decided", l.Current() != first, l.Shapes(), l.Decided())
	}
	inf.synced.Store(true)
	if err := wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return l.Current() != first && l.Decided(), nil
	}); err != nil {
		t.Fatal("the policy was not built once the first list was in")
	}
	built := l.Current()
	for i := 35; i < 44; i++ {
		inf.h.OnAdd(pod(i), false)
	}
	if l.Current() != built {
		t.Error("rebuilt before Every new pods")
	}
	inf.h.OnUpdate(nil, pod(44))
	if l.Current() == built {
		t.Error("not rebuilt after Every new pods")
	}
}
