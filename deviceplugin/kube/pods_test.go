package kube_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2/ktesting"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/deviceplugin/devices"
	"github.com/tessera-gpu/tessera/deviceplugin/kube"
)

type podsReport struct {
	assigned map[string]bool
	released bool
}

func TestPodWatch(t *testing.T) {
	slice := func(uuid string) api.ContainerAssignment {
		return api.ContainerAssignment{Name: "b", Shared: &api.SharedGPU{GPU: api.GPURef{UUID: uuid}, MemoryMiB: 1024, Cores: 10}}
	}
	const gpu4 = "GPU-44444444-0000-0000-0000-000000000000"
	cs := fake.NewClientset(
		pod("ns", "a", "n1", sealed(t, "a", slice(gpu0))),
		pod("ns", "whole", "n1", sealed(t, "whole", api.ContainerAssignment{Name: "main", GPUs: []api.GPURef{{UUID: gpu1, Index: 1}}})),
		pod("ns", "elsewhere", "n2", sealed(t, "elsewhere", slice(gpu1))),
		pod("ns", "bad", "n1", map[string]string{api.AnnotationAssignment: "{not json"}),
		// A tenant's slice on every GPU, and a seal copied from pod a:
		// neither withholds anything.
		pod("ns", "forged", "n1", map[string]string{api.AnnotationAssignment: assignmentValue(t, slice(gpu4))}),
		pod("ns", "copied", "n1", sealed(t, "a", slice(gpu4))),
	)
	// The fake clientset does not replay to a watch what was created
	// between the informer's list and its watch: the test creates pods only
	// once the watch is established.
	watching := make(chan struct{})
	var watchOnce sync.Once
	cs.PrependWatchReactor("pods", func(action k8stesting.Action) (bool, watch.Interface, error) {
		var opts metav1.ListOptions
		if wa, ok := action.(k8stesting.WatchActionImpl); ok {
			opts = wa.ListOptions
		}
		w, err := cs.Tracker().Watch(action.GetResource(), action.GetNamespace(), opts)
		watchOnce.Do(func() { close(watching) })
		return true, w, err
	})
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	reports := make(chan podsReport, 100)
	done := make(chan struct{})
	w := kube.NewPodWatch(cs, "n1", testTrust(t))
	go func() {
		defer close(done)
		w.Run(ctx, func(assigned map[string]bool, released bool) {
			reports <- podsReport{assigned, released}
		})
	}()
	t.Cleanup(func() { cancel(); <-done })

	// wait returns the first report with want assigned, failing on a
	// release before it unless released is expected.
	wait := func(what string, want map[string]bool, released bool) {
		t.Helper()
		timeout := time.After(10 * time.Second)
		for {
			select {
			case r := <-reports:
				if r.released && !released {
					t.Fatalf("%s: unexpected release report %v", what, r)
				}
				if cmp.Equal(want, r.assigned) && r.released == released {
					return
				}
			case <-timeout:
				t.Fatalf("%s: no report of %v (released %v)", what, want, released)
			}
		}
	}
	set := func(uuids ...string) map[string]bool {
		m := map[string]bool{}
		for _, u := range uuids {
			m[u] = true
		}
		return m
	}
	wait("start: the slice on this node only", set(gpu0), false)
	select {
	case <-watching:
	case <-time.After(10 * time.Second):
		t.Fatal("the pod watch never started watching")
	}

	if _, err := cs.CoreV1().Pods("ns").Create(ctx, pod("ns", "b", "n1", sealed(t, "b", slice(gpu2))), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	wait("a second slice bound", set(gpu0, gpu2), false)

	a, err := cs.CoreV1().Pods("ns").Get(ctx, "a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	a.Status.Phase = corev1.PodFailed
	if _, err := cs.CoreV1().Pods("ns").UpdateStatus(ctx, a, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	wait("the first slice failed", set(gpu2), true)
	// UIDs (for Events on pods): of the node's pods, ended or not.
	for _, tc := range []struct {
		name string
		want string
	}{{"a", "uid-a"}, {"whole", "uid-whole"}, {"nowhere", ""}} {
		if got := w.PodUID("ns", tc.name); string(got) != tc.want {
			t.Errorf("PodUID(ns/%s) = %q, want %q", tc.name, got, tc.want)
		}
	}

	// A pod whose assignment turns malformed or unsealed (a tenant edited
	// it) keeps its last good reading.
	const gpu3 = "GPU-33333333-0000-0000-0000-000000000000"
	b, err := cs.CoreV1().Pods("ns").Get(ctx, "b", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b.Annotations[api.AnnotationAssignment] = "{garbage"
	if _, err := cs.CoreV1().Pods("ns").Update(ctx, b, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Pods("ns").Create(ctx, pod("ns", "d", "n1", sealed(t, "d", slice(gpu3))), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	wait("a slice on another GPU, the malformed one kept", set(gpu2, gpu3), false)

	// A whole-GPU pod that goes away releases too, with no change of
	// assigned GPUs.
	if err := cs.CoreV1().Pods("ns").Delete(ctx, "whole", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	wait("the whole-GPU pod deleted", set(gpu2, gpu3), true)
	if got := w.PodUID("ns", "whole"); got != "" {
		t.Errorf("PodUID of a deleted pod = %q", got)
	}
	if err := cs.CoreV1().Pods("ns").Delete(ctx, "b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	wait("the second slice deleted", set(gpu3), true)

	// The API read: every pod of the node that has not ended, without the
	// watch; those the kubelet has not started (d has) apart.
	d, err := cs.CoreV1().Pods("ns").Get(ctx, "d", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	d.Status.StartTime = &metav1.Time{Time: time.Now()}
	if _, err := cs.CoreV1().Pods("ns").UpdateStatus(ctx, d, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Pods("ns").Create(ctx, pod("ns", "c", "n1", sealed(t, "c", slice(gpu2))), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	got, err := kube.NewPodWatch(cs, "n1", testTrust(t)).Assigned(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The unstarted pods asking for units, as the kubelet may be admitting
	// them: with the GPUs of their containers' sealed assignments (none
	// for those the trust filter dropped).
	unstarted := func(name string, gpus ...string) devices.SlicePod {
		return devices.SlicePod{Namespace: "ns", Name: name, UID: "uid-" + name, Containers: []devices.SliceContainer{{
			Name: "b", Units: map[corev1.ResourceName]int64{api.ResourceGPUMemory: 4, api.ResourceGPUCore: 50}, GPUs: gpus,
		}}}
	}
	want := devices.Assignments{GPUs: set(gpu2, gpu3), Unstarted: set(gpu2), Slices: []devices.SlicePod{
		unstarted("bad"), unstarted("c", gpu2), unstarted("copied"), unstarted("forged"),
	}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Assigned (-want +got):\n%s", diff)
	}
}
