package main

import (
	"context"
	"reflect"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/tessera-gpu/tessera/allocator"
	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/sim"
)

// TestTesseraNodeAgent checks the stand-in node agent: it records the
// lowest free GPUs of the node for a bound whole-GPU pod, sealed, skipping
// GPUs that hold a slice (bound or not yet) or another whole-GPU pod.
func TestTesseraNodeAgent(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	sealer, err := api.NewSealer(key)
	if err != nil {
		t.Fatal(err)
	}
	const node = "n1"
	pod := func(name, nodeName string, r allocator.Request, shared []int, whole []int) *v1.Pod {
		p := tracePod(sysTessera, "bench", "sched", "run", 0, sim.PodSpec{Name: name, Request: r})
		p.Name, p.UID, p.Spec.NodeName = name, types.UID("uid-"+name), nodeName
		p.Annotations = map[string]string{}
		a := api.NewAssignment()
		if len(shared) > 0 {
			a.Containers = append(a.Containers, api.ContainerAssignment{Name: "main", Shared: &api.SharedGPU{
				GPU: api.GPURef{UUID: gpuUUID(node, shared[0]), Index: shared[0]}, MemoryMiB: 1024, Cores: 10}})
		}
		if len(whole) > 0 {
			var refs []api.GPURef
			for _, i := range whole {
				refs = append(refs, api.GPURef{UUID: gpuUUID(node, i), Index: i})
			}
			a.Containers = append(a.Containers, api.ContainerAssignment{Name: "main", GPUs: refs})
		}
		if len(a.Containers) > 0 {
			ann, err := sealer.AssignmentAnnotations(p.UID, a)
			if err != nil {
				t.Fatal(err)
			}
			p.Annotations = ann
		}
		return p
	}
	slice := allocator.Request{GPUMilli: 100}
	for _, tc := range []struct {
		name string
		pods []*v1.Pod
		want map[string][]int // pod -> recorded GPU indices
	}{
		{"free node", []*v1.Pod{pod("w", node, allocator.Request{GPUs: 2}, nil, nil)}, map[string][]int{"w": {0, 1}}},
		{"past a slice and a whole pod", []*v1.Pod{
			pod("s", node, slice, []int{0}, nil),
			pod("old", node, allocator.Request{GPUs: 1}, nil, []int{1}),
			pod("w", node, allocator.Request{GPUs: 2}, nil, nil),
		}, map[string][]int{"w": {2, 3}}},
		// A slice whose Binding is still in flight (no node yet) holds its
		// GPU already.
		{"slice not bound yet", []*v1.Pod{
			pod("s", "", slice, []int{0}, nil),
			pod("w", node, allocator.Request{GPUs: 1}, nil, nil),
		}, map[string][]int{"w": {1}}},
		{"two pending", []*v1.Pod{
			pod("a", node, allocator.Request{GPUs: 1}, nil, nil),
			pod("b", node, allocator.Request{GPUs: 2}, nil, nil),
		}, map[string][]int{"a": {0}, "b": {1, 2}}},
		{"not bound", []*v1.Pod{pod("w", "", allocator.Request{GPUs: 1}, nil, nil)}, map[string][]int{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			client := fake.NewClientset(&v1.Secret{ObjectMeta: metav1.ObjectMeta{Name: api.SealKeySecretName, Namespace: "kube-system"},
				Data: map[string][]byte{api.SealKeyDataKey: key}})
			for _, p := range tc.pods {
				if _, err := client.CoreV1().Pods("bench").Create(ctx, p, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			a, err := startTesseraNodeAgent(ctx, client, "bench", "kube-system", func(string) int { return 4 }, 1)
			if err != nil {
				t.Fatal(err)
			}
			defer a.stop()
			var got map[string][]int
			for {
				got = map[string][]int{}
				for _, p := range tc.pods {
					out, err := client.CoreV1().Pods("bench").Get(ctx, p.Name, metav1.GetOptions{})
					if err != nil {
						t.Fatal(err)
					}
					asg, ok, err := sealer.Assignment(out.UID, out.Annotations)
					if err != nil {
						t.Fatalf("pod %s: %v", p.Name, err)
					}
					if !ok || p.Annotations[api.AnnotationAssignment] != "" {
						continue // none, or the test's own
					}
					for _, c := range asg.Containers {
						for _, g := range c.GPUs {
							got[p.Name] = append(got[p.Name], g.Index)
						}
					}
				}
				if len(got) >= len(tc.want) || ctx.Err() != nil {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("recorded %v, want %v", got, tc.want)
			}
			if _, failures, lastErr := a.counts(); failures > 0 {
				t.Errorf("%d failures, the last: %v", failures, lastErr)
			}
		})
	}
}
