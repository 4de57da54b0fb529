package kube_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/deviceplugin/kube"
)

// published is what TestCheckNode's client publishes on its Node.
type published struct {
	inventory, numa string
	condition       *corev1.NodeCondition
}

func publishAll(t *testing.T, ctx context.Context, c *kube.Client) published {
	t.Helper()
	inv := &api.GPUInventory{
		APIVersion: api.Version, Kind: api.KindGPUInventory, MemoryUnitMiB: 1024,
		Resources: []string{string(api.ResourceGPU)},
		GPUs:      []api.InventoryGPU{{Index: 0, UUID: gpu0, Model: "A100", MemoryMiB: 40960, MemoryUnits: 40, Healthy: true}},
		Links:     [][]string{{"X"}}, NVLinkCliques: [][]int{{0}},
	}
	numa := &api.NUMATopology{APIVersion: api.Version, Kind: api.KindNUMATopology, TopologyManagerPolicy: api.TopologyPolicyNone,
		TopologyManagerScope: api.TopologyScopeContainer, CPUManagerPolicy: api.CPUManagerPolicyNone, Source: api.NUMASourcePodResources, Zones: []api.NUMAZone{}}
	if err := c.PublishInventory(ctx, inv); err != nil {
		t.Fatal(err)
	}
	if err := c.PublishNUMATopology(ctx, numa); err != nil {
		t.Fatal(err)
	}
	if err := c.SetSharedIsolation(ctx, true, "NRI connected"); err != nil {
		t.Fatal(err)
	}
	invValue, err := api.EncodeGPUInventory(inv)
	if err != nil {
		t.Fatal(err)
	}
	numaValue, err := api.EncodeNUMATopology(numa)
	if err != nil {
		t.Fatal(err)
	}
	return published{inventory: invValue, numa: numaValue}
}

// onNode reads what the Node holds of what the client publishes.
func onNode(t *testing.T, ctx context.Context, cs *fake.Clientset) (got published, uid types.UID) {
	t.Helper()
	n, err := cs.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got.inventory, got.numa = n.Annotations[api.AnnotationGPUInventory], n.Annotations[api.AnnotationNUMATopology]
	for i, c := range n.Status.Conditions {
		if c.Type == api.ConditionSharedGPUIsolation {
			got.condition = &n.Status.Conditions[i]
		}
	}
	return got, n.UID
}

func TestCheckNode(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	wantCondition := &corev1.NodeCondition{
		Type: api.ConditionSharedGPUIsolation, Status: corev1.ConditionTrue, Reason: api.ReasonNRIConnected,
		Message: "NRI connected", LastHeartbeatTime: metav1.NewTime(now), LastTransitionTime: metav1.NewTime(now),
	}
	for _, tc := range []struct {
		name string
		// change does to the Node what happens to it after the client
		// published.
		change      func(t *testing.T, ctx context.Context, cs *fake.Clientset)
		wantPatches int
	}{
		{
			name:   "node untouched: nothing written",
			change: func(*testing.T, context.Context, *fake.Clientset) {},
		},
		{
			name: "node deleted and created again with its labels (a kubelet re-registration)",
			change: func(t *testing.T, ctx context.Context, cs *fake.Clientset) {
				if err := cs.CoreV1().Nodes().Delete(ctx, "n1", metav1.DeleteOptions{}); err != nil {
					t.Fatal(err)
				}
				n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", UID: "uid-2", Labels: map[string]string{"gpu": "a100"}}}
				if _, err := cs.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			},
			wantPatches: 2, // the annotations, the condition
		},
		{
			name: "an annotation removed, the other changed",
			change: func(t *testing.T, ctx context.Context, cs *fake.Clientset) {
				patch := `{"metadata":{"annotations":{"` + api.AnnotationGPUInventory + `":null,"` + api.AnnotationNUMATopology + `":"{}"}}}`
				if _, err := cs.CoreV1().Nodes().Patch(ctx, "n1", types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
					t.Fatal(err)
				}
			},
			wantPatches: 1,
		},
		{
			name: "the condition says otherwise",
			change: func(t *testing.T, ctx context.Context, cs *fake.Clientset) {
				patch := `{"status":{"conditions":[{"type":"` + api.ConditionSharedGPUIsolation + `","status":"False"}]}}`
				if _, err := cs.CoreV1().Nodes().Patch(ctx, "n1", types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}, "status"); err != nil {
					t.Fatal(err)
				}
			},
			wantPatches: 1,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			cs := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", UID: "uid-1"}})
			c := kube.New(cs, "n1", testTrust(t), func() time.Time { return now })
			want := publishAll(t, ctx, c)
			want.condition = wantCondition
			tc.change(t, ctx, cs)
			before := patches(cs)
			if err := c.CheckNode(ctx); err != nil {
				t.Fatal(err)
			}
			// The publishers, called again with the same values, write
			// nothing: the check is what brings them back.
			publishAll(t, ctx, c)
			if n := patches(cs) - before; n != tc.wantPatches {
				t.Errorf("%d patches, want %d", n, tc.wantPatches)
			}
			got, _ := onNode(t, ctx, cs)
			if diff := cmp.Diff(want, got, cmp.AllowUnexported(published{})); diff != "" {
				t.Errorf("on the Node after the check (-want +got):\n%s", diff)
			}
		})
	}
}

func TestCheckNodeAbsent(t *testing.T) {
	ctx := context.Background()
	cs := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}})
	c := kube.New(cs, "n1", testTrust(t), nil)
	publishAll(t, ctx, c)
	if err := cs.CoreV1().Nodes().Delete(ctx, "n1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	before := patches(cs)
	if err := c.CheckNode(ctx); err != nil {
		t.Errorf("CheckNode without a Node: %v, want nil (nothing to write yet)", err)
	}
	if n := patches(cs) - before; n != 0 {
		t.Errorf("%d patches without a Node, want 0", n)
	}
}

// TestWatchNode checks that the loop checks: the Node, re-created while
// it runs, gets its annotations back.
func TestWatchNode(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cs := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", UID: "uid-1"}})
	c := kube.New(cs, "n1", testTrust(t), nil)
	want := publishAll(t, ctx, c)
	if err := cs.CoreV1().Nodes().Delete(ctx, "n1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", UID: "uid-2"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); c.WatchNode(ctx, 5*time.Millisecond) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, uid := onNode(t, ctx, cs)
		if uid == "uid-2" && got.inventory == want.inventory && got.numa == want.numa && got.condition != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 10 s the re-created Node holds %+v, want the inventory and NUMA annotations and the condition back", got)
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	<-done
}
