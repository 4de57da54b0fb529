package planner_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/extender"
	"github.com/tessera-gpu/tessera/extender/internal/testbuild"
	"github.com/tessera-gpu/tessera/extender/planner"
)

func podGroupObject(gvr schema.GroupVersionResource, ns, name string, spec map[string]any) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": gvr.GroupVersion().String(), "kind": "PodGroup",
		"metadata": map[string]any{"namespace": ns, "name": name},
		"spec":     spec,
	}}
}

// withPodGroups gives the fixture's planner a dynamic client holding
// PodGroup objects of both kinds.
func (f *gangFixture) withPodGroups(objs ...runtime.Object) {
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{
		api.PodGroupGVR: "PodGroupList", api.VolcanoPodGroupGVR: "PodGroupList",
	}, objs...)
	f.gangClient = &planner.KubeGang{Client: f.client, Dynamic: dyn, Sealer: testbuild.Sealer(f.t)}
	f.planner.SetClient(f.gangClient)
}

// volcanoMember creates a gated pod naming its Volcano PodGroup.
func (f *gangFixture) volcanoMember(group string, i, gpus int) {
	f.t.Helper()
	p := testbuild.Pod(fmt.Sprintf("%s-%d", group, i)).Whole(int64(gpus)).Obj()
	p.Annotations[api.AnnotationVolcanoGroupName] = group
	p.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: "other.example/gate"}, {Name: api.SchedulingGateGang}}
	if _, err := f.client.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		f.t.Fatal(err)
	}
}

// A Volcano gang is sized by its Volcano PodGroup, not by a
// scheduler-plugins PodGroup of the same name.
func TestGangVolcanoPodGroup(t *testing.T) {
	f := newGangFixture(t, testbuild.EightGPUNodes(2)...)
	f.withPodGroups(
		podGroupObject(api.VolcanoPodGroupGVR, "default", "train", map[string]any{"minMember": int64(3), "queue": "research"}),
		podGroupObject(api.PodGroupGVR, "default", "train", map[string]any{"minMember": int64(5)}),
	)
	f.volcanoMember("train", 0, 4)
	f.volcanoMember("train", 1, 4)
	f.sync()
	for name, s := range f.state("train-") {
		if s.planned || !s.gated {
			t.Fatalf("%s planned with 2 of 3 members: %+v", name, s)
		}
	}
	if !f.hasEvent("2 of 3 members exist") {
		t.Errorf("no Event says 2 of 3 members exist: %v", f.events.Events)
	}
	f.volcanoMember("train", 2, 4)
	f.sync()
	st := f.state("train-")
	if len(st) != 3 {
		t.Fatalf("members %v", st)
	}
	for name, s := range st {
		if !s.planned || s.gated || s.node == "" {
			t.Errorf("%s not planned and released with the whole Volcano gang: %+v", name, s)
		}
	}
}

// A malformed Volcano PodGroup, or a missing one, holds the members with
// an Event that says why.
func TestGangVolcanoPodGroupRefused(t *testing.T) {
	for name, tc := range map[string]struct {
		objs []runtime.Object
		want string
	}{
		"minMember 0":      {[]runtime.Object{podGroupObject(api.VolcanoPodGroupGVR, "default", "bad", map[string]any{"minMember": int64(0)})}, "Volcano PodGroup default/bad: invalid gang declaration: spec.minMember must be an integer from 1 to 2147483647; got 0"},
		"minMember string": {[]runtime.Object{podGroupObject(api.VolcanoPodGroupGVR, "default", "bad", map[string]any{"minMember": "2"})}, `spec.minMember must be an integer from 1 to 2147483647; got "2"`},
		"only a scheduler-plugins PodGroup": {[]runtime.Object{podGroupObject(api.PodGroupGVR, "default", "bad", map[string]any{"minMember": int64(2)})},
			"VolcanoPodGroup default/bad cannot be read"},
	} {
		t.Run(name, func(t *testing.T) {
			f := newGangFixture(t, testbuild.EightGPUNodes(1)...)
			f.withPodGroups(tc.objs...)
			f.volcanoMember("bad", 0, 1)
			f.volcanoMember("bad", 1, 1)
			f.sync()
			f.sync()
			for name, s := range f.state("bad-") {
				if s.planned || !s.gated {
					t.Errorf("%s of a refused Volcano PodGroup: %+v; want it held", name, s)
				}
			}
			if !f.hasEvent(tc.want) {
				t.Errorf("no Event containing %q: %v", tc.want, f.events.Events)
			}
		})
	}
}

// A pod that names a PodGroup waits for it, whatever its annotations say:
// a size of its own (tessera.dev/gang-min-member) overrides the object's
// but does not stand in for a PodGroup that is missing (it did: such a pod
// ran alone, while one without the annotation waited). Once the PodGroup
// exists, the pod's size wins over the object's.
func TestGangWaitsForItsPodGroupWhateverItsAnnotations(t *testing.T) {
	for _, tc := range []struct {
		name string
		gvr  schema.GroupVersionResource
		set  func(p *corev1.Pod)
		want string
	}{
		{"scheduler-plugins", api.PodGroupGVR, func(p *corev1.Pod) { p.Labels = map[string]string{api.LabelPodGroup: "train"} }, "PodGroup default/train cannot be read"},
		{"Volcano", api.VolcanoPodGroupGVR, func(p *corev1.Pod) { p.Annotations[api.AnnotationVolcanoGroupName] = "train" }, "VolcanoPodGroup default/train cannot be read"},
	} {
		for _, ann := range []map[string]string{nil, {api.AnnotationGangMinMember: "1"}, {api.AnnotationGangMinMember: "1", api.AnnotationGangTimeout: "60"}} {
			t.Run(fmt.Sprintf("%s %v", tc.name, ann), func(t *testing.T) {
				f := newGangFixture(t, testbuild.EightGPUNodes(1)...)
				f.withPodGroups()
				p := testbuild.Pod("train-0").Whole(1).Obj()
				tc.set(p)
				for k, v := range ann {
					p.Annotations[k] = v
				}
				p.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: "other.example/gate"}, {Name: api.SchedulingGateGang}}
				if _, err := f.client.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
				f.sync()
				f.sync()
				if s := f.state("train-")["train-0"]; s.planned || !s.gated {
					t.Fatalf("without its PodGroup: %+v, want it held", s)
				}
				if !f.hasEvent(tc.want) {
					t.Errorf("no Event containing %q: %v", tc.want, f.events.Events)
				}
				// The PodGroup appears (asking for 2): the pod's own size,
				// when it has one, wins.
				f.withPodGroups(podGroupObject(tc.gvr, "default", "train", map[string]any{"minMember": int64(2)}))
				f.sync()
				s := f.state("train-")["train-0"]
				if ann == nil && (s.planned || !s.gated) {
					t.Errorf("1 of the PodGroup's 2 members planned: %+v", s)
				}
				if ann != nil && (!s.planned || s.gated) {
					t.Errorf("with its PodGroup and a size of 1: %+v, want it planned", s)
				}
			})
		}
	}
}

func (f *gangFixture) hasEvent(want string) bool {
	f.events.Mu.Lock()
	defer f.events.Mu.Unlock()
	for _, e := range f.events.Events {
		if strings.HasPrefix(e, "GangWaiting: ") && strings.Contains(e, want) {
			return true
		}
	}
	return false
}

// The planner's GangBook completes a PodGroup-declared gang from its
// PodGroup: its members carry no minMember (api.GangOf gives 0, so no
// member counted as extra for preemption and reclaim); after a pass the
// book gives the PodGroup's.
func TestGangBookKnowsAPodGroupsMinMember(t *testing.T) {
	f := newGangFixture(t, testbuild.EightGPUNodes(2)...)
	book := &planner.GangBook{}
	f.planner = planner.NewGangPlanner(planner.GangPlannerConfig{Ledger: extender.PlannerLedger{Cache: f.cache}, Client: f.gangClient, Pods: f.list,
		Policy: testPolicy(t, extender.PolicyBinpack), Events: f.events, Now: func() time.Time { return f.now }, Gangs: book})
	f.withPodGroups(podGroupObject(api.PodGroupGVR, "default", "train", map[string]any{"minMember": int64(2)}))
	var members []*corev1.Pod
	for i := range 3 {
		p := testbuild.Pod(fmt.Sprintf("train-%d", i)).Whole(4).Obj()
		p.Labels = map[string]string{api.LabelPodGroup: "train"}
		p.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: api.SchedulingGateGang}}
		if _, err := f.client.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		members = append(members, p)
	}
	if g, _, _ := book.GangOf(members[0]); g.MinMember != 0 {
		t.Fatalf("before any pass: minMember %d, want api.GangOf's 0", g.MinMember)
	}
	f.sync()
	g, ok, err := book.GangOf(members[2])
	if !ok || err != nil || g.MinMember != 2 || g.Key() != "default/train" {
		t.Fatalf("after a pass: %+v %v %v, want gang default/train of minMember 2", g, ok, err)
	}
	var nilBook *planner.GangBook
	if g, _, _ := nilBook.GangOf(members[0]); g.MinMember != 0 {
		t.Errorf("no book: minMember %d, want api.GangOf's 0", g.MinMember)
	}
	other := testbuild.Pod("solo").Whole(1).Obj()
	if _, ok, _ := book.GangOf(other); ok {
		t.Error("a pod outside any gang has a gang")
	}
}
