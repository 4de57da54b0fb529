package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/tessera-gpu/tessera/api"
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
	}}}
	value, err := api.EncodeMIGLayoutRequest(req)
	if err != nil {
		t.Fatal(err)
	}
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Annotations: map[string]string{api.AnnotationMIGLayoutRequest: value}}})
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
