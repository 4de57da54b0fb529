package deviceplugin_test

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2/ktesting"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/deviceplugin"
	"github.com/tessera-gpu/tessera/deviceplugin/kube"
	"github.com/tessera-gpu/tessera/deviceplugin/kubeletstate"
	"github.com/tessera-gpu/tessera/gpu/nvmlmock"
)

// recordedEvent is one Event as fakeEvents saw it.
type recordedEvent struct {
	Kind, Namespace, Name string
	UID                   types.UID
	Type, Reason, Message string
}

// fakeEvents records the Events the agent raises.
type fakeEvents struct {
	mu   sync.Mutex
	list []recordedEvent
}

var _ deviceplugin.EventRecorder = (*fakeEvents)(nil)

func (f *fakeEvents) Eventf(obj runtime.Object, eventtype, reason, messageFmt string, args ...any) {
	ev := recordedEvent{Type: eventtype, Reason: reason, Message: fmt.Sprintf(messageFmt, args...)}
	if ref, ok := obj.(*corev1.ObjectReference); ok {
		ev.Kind, ev.Namespace, ev.Name, ev.UID = ref.Kind, ref.Namespace, ref.Name, ref.UID
	} else {
		ev.Kind = fmt.Sprintf("%T", obj)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.list = append(f.list, ev)
}

func (f *fakeEvents) events() []recordedEvent {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]recordedEvent(nil), f.list...)
}

// waitEvents waits until n Events were recorded, then for a few more
// health checks, and returns them all.
func (f *fakeEvents) waitEvents(t *testing.T, what string, n int) []recordedEvent {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for len(f.events()) < n {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %d Events (%s); have %v", n, what, f.events())
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond) // 10 health checks: no Event more
	return f.events()
}

// slicePublisher is an API server that records nothing and places the
// shared containers the test names (SyncPods' answer).
type slicePublisher struct {
	placements map[kubeletstate.ContainerKey]string
}

func (p slicePublisher) PublishInventory(context.Context, *api.GPUInventory) error { return nil }
func (p slicePublisher) SetSharedIsolation(context.Context, bool, string) error    { return nil }
func (p slicePublisher) SyncPods(_ context.Context, allocs []kubeletstate.ContainerDevices, _ map[string]int, _ map[string]kube.MIGDevice) (map[kubeletstate.ContainerKey]string, error) {
	out := map[kubeletstate.ContainerKey]string{}
	for _, c := range allocs {
		if g, ok := p.placements[c.Key()]; ok {
			out[c.Key()] = g
		}
	}
	return out, nil
}

// uidPodWatch is a pod watch that also knows the pods' UIDs.
type uidPodWatch struct {
	*fakePodWatch
	uids map[string]types.UID
}

var (
	_ deviceplugin.PodUIDs = uidPodWatch{}
	_ deviceplugin.PodUIDs = (*kube.PodWatch)(nil)
)

func (w uidPodWatch) PodUID(namespace, name string) types.UID { return w.uids[namespace+"/"+name] }

// A GPU that turns unhealthy under running pods raises a Warning on the
// Node and on every pod that holds it (whole, or a slice of it), once per
// change however many health checks follow; a GPU healthy again raises a
// Normal Event on the Node.
func TestGPUHealthChangesRaiseNodeAndPodEvents(t *testing.T) {
	m := nvmlmock.DGXA100()
	uuid := m.UUID
	events := &fakeEvents{}
	kubelet := &fakeSource{}
	kubelet.set(
		// GPU 3 whole, to pod train.
		kubeletstate.ContainerDevices{Namespace: "ml", Name: "train", Container: "c", Resource: gpuR, DeviceIDs: []string{uuid(3)}},
		// GPU 5 shared: slice-a by memory and core units of GPU 5; slice-b
		// by units whose IDs name GPU 0 (nominal), placed on GPU 5.
		kubeletstate.ContainerDevices{Namespace: "ml", Name: "slice-a", Container: "c", Resource: memR, DeviceIDs: unitsOf(memR, uuid(5), 2)},
		kubeletstate.ContainerDevices{Namespace: "ml", Name: "slice-a", Container: "c", Resource: coreR, DeviceIDs: unitsOf(coreR, uuid(5), 10)},
		kubeletstate.ContainerDevices{Namespace: "dev", Name: "slice-b", Container: "c", Resource: memR, DeviceIDs: unitsOf(memR, uuid(0), 1)},
		// GPU 6 whole, to a pod that sees no Event.
		kubeletstate.ContainerDevices{Namespace: "ml", Name: "bystander", Container: "c", Resource: gpuR, DeviceIDs: []string{uuid(6)}},
	)
	pods := uidPodWatch{fakePodWatch: &fakePodWatch{updates: make(chan podsUpdate)}, uids: map[string]types.UID{
		"ml/train": "uid-train", "ml/slice-a": "uid-a", "dev/slice-b": "uid-b", "ml/bystander": "uid-by",
	}}
	pub := slicePublisher{placements: map[kubeletstate.ContainerKey]string{{Namespace: "dev", Name: "slice-b", Container: "c"}: uuid(5)}}
	e := newEnv(t, m, nil, withPublisher(pub), func(o *deviceplugin.Options) {
		o.Events, o.Kubelet, o.Pods = events, kubelet, pods
	})
	e.nri.connected.Store(true)
	e.start(true)
	all := e.totals()
	e.kubelet.waitCounts("registration", all, e.healthyBut(1, 2))
	if got := events.events(); len(got) != 0 {
		t.Fatalf("Events with every GPU healthy: %v", got)
	}

	node := func(typ, reason, message string) recordedEvent {
		return recordedEvent{Kind: "Node", Name: "n1", UID: "n1", Type: typ, Reason: reason, Message: message}
	}
	pod := func(ns, name string, uid types.UID, message string) recordedEvent {
		return recordedEvent{Kind: "Pod", Namespace: ns, Name: name, UID: uid, Type: corev1.EventTypeWarning, Reason: api.EventGPUUnhealthy, Message: message}
	}
	check := func(what string, want []recordedEvent) {
		t.Helper()
		if diff := cmp.Diff(want, events.waitEvents(t, what, len(want))); diff != "" {
			t.Errorf("Events after %s (-want +got):\n%s", what, diff)
		}
	}

	// A critical XID on GPU 3, which pod train holds whole.
	deadline := time.Now().Add(20 * time.Second)
	for m.InjectXID(3, 79) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the agent never registered for XID events")
		}
		time.Sleep(10 * time.Millisecond)
	}
	want := []recordedEvent{
		node(corev1.EventTypeWarning, api.EventGPUUnhealthy, fmt.Sprintf("GPU 3 (%s) is unhealthy: XID 79; its devices are withheld until it is healthy again", uuid(3))),
		pod("ml", "train", "uid-train", fmt.Sprintf("GPU 3 (%s) on node n1, which this pod uses, is unhealthy: XID 79", uuid(3))),
	}
	check("XID 79 on GPU 3", want)
	// The same XID again changes nothing.
	m.InjectXID(3, 79)
	check("XID 79 on GPU 3 again", want)

	// GPU 5, shared by two slices, falls off the bus.
	m.SetLost(5, true)
	lost := "GPU lost (fell off the bus)"
	want = append(want,
		node(corev1.EventTypeWarning, api.EventGPUUnhealthy, fmt.Sprintf("GPU 5 (%s) is unhealthy: %s; its devices are withheld until it is healthy again", uuid(5), lost)),
		pod("dev", "slice-b", "uid-b", fmt.Sprintf("GPU 5 (%s) on node n1, which this pod uses, is unhealthy: %s", uuid(5), lost)),
		pod("ml", "slice-a", "uid-a", fmt.Sprintf("GPU 5 (%s) on node n1, which this pod uses, is unhealthy: %s", uuid(5), lost)),
	)
	check("GPU 5 lost", want)

	// GPU 5 comes back: healthy at the next check.
	m.SetLost(5, false)
	want = append(want, node(corev1.EventTypeNormal, api.EventGPUHealthy, fmt.Sprintf("GPU 5 (%s) is healthy again (it was unhealthy: %s)", uuid(5), lost)))
	check("GPU 5 back", want)

	// GPU 3 after its recovery delay.
	e.clock.Add(time.Hour)
	want = append(want, node(corev1.EventTypeNormal, api.EventGPUHealthy, fmt.Sprintf("GPU 3 (%s) is healthy again (it was unhealthy: XID 79)", uuid(3))))
	check("GPU 3 recovered", want)
	for _, ev := range events.events() {
		if ev.Name == "bystander" || strings.Contains(ev.Message, uuid(6)) {
			t.Errorf("Event about GPU 6, which stayed healthy: %v", ev)
		}
	}
}

// A GPU that is unhealthy when the agent starts (after its topology was
// read: a GPU lost before is not advertised) raises its Events too, with
// the pods the kubelet says hold it.
func TestGPUUnhealthyAtStartRaisesEvents(t *testing.T) {
	m := nvmlmock.PCIe2NUMA()
	events := &fakeEvents{}
	kubelet := &fakeSource{}
	kubelet.set(kubeletstate.ContainerDevices{Namespace: "ml", Name: "train", Container: "c", Resource: gpuR, DeviceIDs: []string{m.UUID(1)}})
	e := newEnv(t, m, nil, func(o *deviceplugin.Options) { o.Events, o.Kubelet = events, kubelet })
	m.SetLost(1, true)
	e.start(true)
	want := []recordedEvent{
		{Kind: "Node", Name: "n1", UID: "n1", Type: corev1.EventTypeWarning, Reason: api.EventGPUUnhealthy, Message: fmt.Sprintf("GPU 1 (%s) is unhealthy: GPU lost (fell off the bus); its devices are withheld until it is healthy again", m.UUID(1))},
		// Without a pod watch the pod's UID is unknown.
		{Kind: "Pod", Namespace: "ml", Name: "train", Type: corev1.EventTypeWarning, Reason: api.EventGPUUnhealthy, Message: fmt.Sprintf("GPU 1 (%s) on node n1, which this pod uses, is unhealthy: GPU lost (fell off the bus)", m.UUID(1))},
	}
	if diff := cmp.Diff(want, events.waitEvents(t, "GPU 1 lost at start", len(want))); diff != "" {
		t.Errorf("Events (-want +got):\n%s", diff)
	}
	all := e.totals()
	e.kubelet.waitCounts("GPU 1 lost", all, e.healthyBut(1, 1))
}

// Through client-go's recorder, as tessera-node wires it, the Events land
// in the API server where kubectl describe finds them: the Node's in
// namespace default with the node's name as UID (as the kubelet's), the
// pod's in its namespace with its UID.
func TestGPUHealthEventsReachTheAPIServer(t *testing.T) {
	m := nvmlmock.PCIe2NUMA()
	cs := fake.NewClientset()
	_, ctx := ktesting.NewTestContext(t)
	b := record.NewBroadcaster(record.WithContext(ctx))
	b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: cs.CoreV1().Events("")})
	t.Cleanup(b.Shutdown)
	kubelet := &fakeSource{}
	kubelet.set(kubeletstate.ContainerDevices{Namespace: "ml", Name: "train", Container: "c", Resource: gpuR, DeviceIDs: []string{m.UUID(0)}})
	pods := uidPodWatch{fakePodWatch: &fakePodWatch{updates: make(chan podsUpdate)}, uids: map[string]types.UID{"ml/train": "uid-train"}}
	e := newEnv(t, m, nil, func(o *deviceplugin.Options) {
		o.Events = b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "tessera-node", Host: "n1"})
		o.Kubelet, o.Pods = kubelet, pods
	}).start(true)
	all := e.totals()
	e.kubelet.waitCounts("registration", all, e.healthyBut(0, 1))
	m.SetLost(0, true)

	type seen struct {
		Namespace, Kind, Name string
		UID                   types.UID
		Type, Reason          string
	}
	want := []seen{
		{"default", "Node", "n1", "n1", corev1.EventTypeWarning, api.EventGPUUnhealthy},
		{"ml", "Pod", "train", "uid-train", corev1.EventTypeWarning, api.EventGPUUnhealthy},
	}
	var got []seen
	deadline := time.Now().Add(20 * time.Second)
	for {
		list, err := cs.CoreV1().Events("").List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		got = got[:0]
		for _, ev := range list.Items {
			o := ev.InvolvedObject
			got = append(got, seen{ev.Namespace, o.Kind, o.Name, o.UID, ev.Type, ev.Reason})
		}
		sort.Slice(got, func(i, j int) bool { return got[i].Namespace < got[j].Namespace })
		if len(got) >= len(want) || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Events in the API server (-want +got):\n%s", diff)
	}
}
