package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/deviceplugin"
	"github.com/tessera-gpu/tessera/deviceplugin/kubeletstate"
	"github.com/tessera-gpu/tessera/gpu"
	"github.com/tessera-gpu/tessera/gpu/nvmlmock"
	"github.com/tessera-gpu/tessera/topology"
)

type staticAllocs []kubeletstate.ContainerDevices

func (s *staticAllocs) Allocations(context.Context) ([]kubeletstate.ContainerDevices, error) {
	return *s, nil
}
func (s *staticAllocs) Name() string { return "static" }

type eventLog struct {
	mu     sync.Mutex
	events []string
}

func (e *eventLog) Eventf(_ kruntime.Object, eventtype, reason, messageFmt string, args ...interface{}) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.events = append(e.events, eventtype+" "+reason+" "+fmt.Sprintf(messageFmt, args...))
}

// TestMIGWatch: a request for a GPU with a tenant is refused (status and
// Event, GPU untouched, not returned for applying); once the tenant is
// gone it is returned, applied, and recorded as Applied.
func TestMIGWatch(t *testing.T) {
	ctx := context.Background()
	m := nvmlmock.Builtin(nvmlmock.DGXA100MIGName)
	g := gpu.NewNVML(m.NVML())
	if err := g.Init(); err != nil {
		t.Fatal(err)
	}
	topo := &topology.Topology{}
	for i := 0; i < 8; i++ {
		topo.GPUs = append(topo.GPUs, topology.GPU{Index: i, UUID: m.UUID(i)})
	}
	req := &api.MIGLayoutRequest{APIVersion: api.Version, Kind: api.KindMIGLayoutRequest, Generation: 7, GPUs: []api.MIGLayoutGPU{{
		UUID: m.UUID(2), Instances: []api.MIGLayoutInstance{{Profile: "7g.40gb", MIGPlacement: api.MIGPlacement{Start: 0, Size: 8}}},
	}}, Pod: &api.MIGLayoutPod{Namespace: "ns", Name: "asker", UID: "uid-asker"}}
	value, err := api.EncodeMIGLayoutRequest(req)
	if err != nil {
		t.Fatal(err)
	}
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Annotations: map[string]string{api.AnnotationMIGLayoutRequest: value}}}, waitingPod("asker"))
	allocs := &staticAllocs{{Namespace: "ns", Name: "tenant", Container: "c", Resource: api.MIGResource("1g.5gb"), DeviceIDs: []string{m.MIGUUIDs(2)[2]}}}
	events := &eventLog{}
	w := newMIGWatch(client, "n1", topo, g, allocs, events, &migFailure{})

	status := func() *api.MIGLayoutStatus {
		t.Helper()
		n, err := client.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		st, err := api.ParseMIGLayoutStatus(n.Annotations[api.AnnotationMIGLayoutStatus])
		if err != nil {
			t.Fatalf("status: %v", err)
		}
		return st
	}
	if got := w.poll(ctx); got != nil {
		t.Fatalf("a request for a GPU with a tenant is to be applied: %+v", got)
	}
	if st := status(); st.State != api.MIGLayoutRefused || st.Generation != 7 || !strings.Contains(st.Message, "ns/tenant") {
		t.Fatalf("status %+v", st)
	}
	w.poll(ctx) // the same refusal: no second Event
	if len(events.events) != 1 || !strings.Contains(events.events[0], "MIGRepartitionRefused") {
		t.Fatalf("events %q", events.events)
	}
	if info, _ := g.MIG(2); len(info.Instances) != 3 {
		t.Fatalf("GPU 2 touched: %+v", info.Instances)
	}

	*allocs = nil // the tenant is gone
	got := w.poll(ctx)
	if got == nil || got.Generation != 7 {
		t.Fatalf("a request for a free GPU is not to be applied: %+v", got)
	}
	w.pending = got
	w.apply(ctx)
	if st := status(); st.State != api.MIGLayoutApplied || st.Generation != 7 {
		t.Fatalf("status after applying %+v", st)
	}
	if info, _ := g.MIG(2); len(info.Instances) != 1 || info.Instances[0].Profile != "7g.40gb" {
		t.Fatalf("GPU 2 after applying: %+v", info.Instances)
	}
	// Served: nothing more to do.
	if got := w.poll(ctx); got != nil {
		t.Fatalf("a served request is to be applied again: %+v", got)
	}
}

// waitingPod is a pending pod of namespace ns, UID "uid-<name>", bound to
// no node.
func waitingPod(name string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-" + name)}, Status: corev1.PodStatus{Phase: corev1.PodPending}}
}

// migWatchOn is a watch of node n1 of a dgx-a100-mig mock whose Node holds
// a request (generation 3) to make GPU 2 one 7g.40gb for pod ns/asker, and
// the objects given.
func migWatchOn(t *testing.T, objs ...kruntime.Object) (*migWatch, *fake.Clientset, gpu.Interface, *eventLog) {
	t.Helper()
	m := nvmlmock.Builtin(nvmlmock.DGXA100MIGName)
	g := gpu.NewNVML(m.NVML())
	if err := g.Init(); err != nil {
		t.Fatal(err)
	}
	topo := &topology.Topology{}
	for i := 0; i < 8; i++ {
		topo.GPUs = append(topo.GPUs, topology.GPU{Index: i, UUID: m.UUID(i)})
	}
	value, err := api.EncodeMIGLayoutRequest(&api.MIGLayoutRequest{APIVersion: api.Version, Kind: api.KindMIGLayoutRequest, Generation: 3, GPUs: []api.MIGLayoutGPU{{
		UUID: m.UUID(2), Instances: []api.MIGLayoutInstance{{Profile: "7g.40gb", MIGPlacement: api.MIGPlacement{Start: 0, Size: 8}}},
	}}, Pod: &api.MIGLayoutPod{Namespace: "ns", Name: "asker", UID: "uid-asker"}})
	if err != nil {
		t.Fatal(err)
	}
	objs = append(objs, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Annotations: map[string]string{api.AnnotationMIGLayoutRequest: value}}})
	client := fake.NewClientset(objs...)
	events := &eventLog{}
	return newMIGWatch(client, "n1", topo, g, &staticAllocs{}, events, &migFailure{}), client, g, events
}

// TestMIGWatchNeedsItsPod: a request whose pod is gone, was replaced by a
// pod of the same name, is being deleted or was placed is never applied
// (an agent started after its pod was deleted included): the status says
// Refused naming the pod and GPU 2 keeps its layout.
func TestMIGWatchNeedsItsPod(t *testing.T) {
	ctx := context.Background()
	now := metav1.Now()
	replaced, deleting, placed := waitingPod("asker"), waitingPod("asker"), waitingPod("asker")
	replaced.UID = "other"
	deleting.DeletionTimestamp = &now
	deleting.Finalizers = []string{"x"}
	placed.Spec.NodeName = "n2"
	for _, tc := range []struct {
		name string
		objs []kruntime.Object
		want string
	}{
		{"pod gone", nil, "its pod ns/asker is gone"},
		{"pod replaced", []kruntime.Object{replaced}, "a new pod has the name"},
		{"pod being deleted", []kruntime.Object{deleting}, "being deleted"},
		{"pod placed", []kruntime.Object{placed}, "placed on node n2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, client, g, events := migWatchOn(t, tc.objs...)
			if got := w.poll(ctx); got != nil {
				t.Fatalf("a request no pod needs is to be applied: %+v", got)
			}
			n, _ := client.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
			st, err := api.ParseMIGLayoutStatus(n.Annotations[api.AnnotationMIGLayoutStatus])
			if err != nil || st.State != api.MIGLayoutRefused || st.Generation != 3 || !strings.Contains(st.Message, tc.want) {
				t.Fatalf("status %+v %v, want Refused saying %q", st, err, tc.want)
			}
			if len(events.events) != 1 || !strings.Contains(events.events[0], "MIGRepartitionRefused") {
				t.Fatalf("events %q", events.events)
			}
			// Even told to apply it (it was read while the pod waited).
			w.pending = &api.MIGLayoutRequest{}
			*w.pending = *mustRequest(t, n)
			w.apply(ctx)
			if info, _ := g.MIG(2); len(info.Instances) != 3 {
				t.Fatalf("GPU 2 repartitioned for no pod: %+v", info.Instances)
			}
		})
	}
}

// TestMIGWatchApplyWithdrawn: a request withdrawn between the poll and the
// apply (device plugins stopped) is not applied.
func TestMIGWatchApplyWithdrawn(t *testing.T) {
	ctx := context.Background()
	w, client, g, _ := migWatchOn(t, waitingPod("asker"))
	req := w.poll(ctx)
	if req == nil {
		t.Fatal("a request for a waiting pod is not to be applied")
	}
	n, _ := client.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
	delete(n.Annotations, api.AnnotationMIGLayoutRequest)
	if _, err := client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	w.pending = req
	w.apply(ctx)
	if info, _ := g.MIG(2); len(info.Instances) != 3 {
		t.Fatalf("GPU 2 repartitioned for a withdrawn request: %+v", info.Instances)
	}
}

func mustRequest(t *testing.T, n *corev1.Node) *api.MIGLayoutRequest {
	t.Helper()
	r, err := api.ParseMIGLayoutRequest(n.Annotations[api.AnnotationMIGLayoutRequest])
	if err != nil {
		t.Fatal(err)
	}
	return r
}

type inventorySink struct {
	deviceplugin.Publisher
	got *api.GPUInventory
}

func (s *inventorySink) PublishInventory(_ context.Context, inv *api.GPUInventory) error {
	s.got = inv
	return nil
}

// TestServesMIGLayouts: with --dynamic-mig the published inventory says
// the agent serves MIG layout requests; the agent's own copy is left as it
// is.
func TestServesMIGLayouts(t *testing.T) {
	sink := &inventorySink{}
	inv := &api.GPUInventory{APIVersion: api.Version, Kind: api.KindGPUInventory}
	if err := (servesMIGLayouts{sink}).PublishInventory(context.Background(), inv); err != nil {
		t.Fatal(err)
	}
	if sink.got == nil || !sink.got.DynamicMIG || inv.DynamicMIG {
		t.Fatalf("published %+v, own %+v", sink.got, inv)
	}
}

// TestPersistMockMIG: --mock-mig-state keeps a mock backend's MIG layouts
// in the file; it needs a mock backend.
func TestPersistMockMIG(t *testing.T) {
	file := t.TempDir() + "/mig.json"
	b, err := gpu.Open("mock:" + nvmlmock.DGXA100MIGName)
	if err != nil {
		t.Fatal(err)
	}
	if err := persistMockMIG(b, file); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(file); err != nil {
		t.Fatalf("no state file: %v", err)
	}
	if err := persistMockMIG(&gpu.Backend{}, file); err == nil || !strings.Contains(err.Error(), "mock") {
		t.Fatalf("a real backend with --mock-mig-state: %v", err)
	}
	if err := persistMockMIG(&gpu.Backend{}, ""); err != nil {
		t.Fatal(err)
	}
}
