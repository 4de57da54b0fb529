package nri

import (
	"context"
	"strings"
	"testing"

	"github.com/containerd/nri/pkg/adaptation"
	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/internal/podtrust"
	"github.com/tessera-gpu/tessera/isolation"
)

func TestLedgerContainerLimits(t *testing.T) {
	l, err := OpenLedger(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range []Entry{
		{PodUID: "u1", Namespace: "ns", Pod: "a", Container: "c", ContainerID: "id1", GPUs: []api.GPURef{{UUID: uuid0, Index: 0}, {UUID: uuid1, Index: 1}}},
		{PodUID: "u2", Namespace: "ns", Pod: "b", Container: "c", ContainerID: "id2", Shared: &api.SharedGPU{GPU: api.GPURef{UUID: uuid2, Index: 2}, MemoryMiB: 2048, Cores: 20}},
		// Two MIG instances of GPU 3: the GPU once, no limit.
		{PodUID: "u3", Namespace: "ns", Pod: "m", Container: "c", ContainerID: "id3", MIG: []api.MIGRef{
			{UUID: "MIG-3000000a-0000-0000-0000-000000000000", Profile: "1g.5gb", GPU: api.GPURef{UUID: uuid3, Index: 3}},
			{UUID: "MIG-3000000b-0000-0000-0000-000000000000", Profile: "1g.5gb", GPU: api.GPURef{UUID: uuid3, Index: 3}},
		}},
	} {
		if err := l.Put(e); err != nil {
			t.Fatal(err)
		}
	}
	want := []isolation.ContainerLimit{
		{ContainerID: "id1", PodUID: "u1", Namespace: "ns", Pod: "a", Container: "c", GPU: api.GPURef{UUID: uuid0, Index: 0}},
		{ContainerID: "id1", PodUID: "u1", Namespace: "ns", Pod: "a", Container: "c", GPU: api.GPURef{UUID: uuid1, Index: 1}},
		{ContainerID: "id2", PodUID: "u2", Namespace: "ns", Pod: "b", Container: "c", GPU: api.GPURef{UUID: uuid2, Index: 2}, LimitMiB: 2048},
		{ContainerID: "id3", PodUID: "u3", Namespace: "ns", Pod: "m", Container: "c", GPU: api.GPURef{UUID: uuid3, Index: 3}},
	}
	if diff := cmp.Diff(want, l.ContainerLimits()); diff != "" {
		t.Errorf("limits (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]api.GPURef{{UUID: uuid2, Index: 2}}, l.SharedGPUs()); diff != "" {
		t.Errorf("shared GPUs (-want +got):\n%s", diff)
	}
}

func TestKubeRecorder(t *testing.T) {
	trust := testTrust()
	a := api.NewAssignment()
	a.Containers = []api.ContainerAssignment{{Name: "train", GPUs: []api.GPURef{{UUID: uuid0, Index: 0}}}}
	whole, err := trust.Sealer.AssignmentAnnotations("uid-p", a)
	if err != nil {
		t.Fatal(err)
	}
	spec := corev1.PodSpec{Containers: []corev1.Container{
		{Name: "train", Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{api.ResourceGPU: resource.MustParse("1")}}},
		{Name: "helper", Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{api.ResourceGPUMemory: resource.MustParse("2")}}},
	}}
	cs := fake.NewSimpleClientset(
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "uid-p", Annotations: whole}, Spec: spec},
		// q's assignment is a tenant's: it is recorded over.
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "q", UID: "uid-q", Annotations: map[string]string{api.AnnotationAssignment: whole[api.AnnotationAssignment]}}, Spec: spec},
	)
	if err := (KubeRecorder{Client: cs}).RecordShared(context.Background(), Pod{Namespace: "ns", Name: "p", UID: "uid-p"}, "helper", api.SharedGPU{}); err == nil {
		t.Error("a recorder without a seal key recorded")
	}
	r := KubeRecorder{Client: cs, Trust: trust}
	s := api.SharedGPU{GPU: api.GPURef{UUID: uuid2, Index: 2}, MemoryMiB: 2048, Cores: 10}
	ctx := context.Background()
	for _, name := range []string{"p", "q"} {
		if err := r.RecordShared(ctx, Pod{Namespace: "ns", Name: name, UID: "uid-" + name}, "helper", s); err != nil {
			t.Fatalf("RecordShared %s: %v", name, err)
		}
	}
	get := func(name string) *api.Assignment {
		p, err := cs.CoreV1().Pods("ns").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		a, found, err := trust.Sealer.Assignment(p.UID, p.Annotations)
		if err != nil || !found {
			t.Fatalf("pod %s: sealed assignment %v, %v", name, found, err)
		}
		return a
	}
	want := api.NewAssignment()
	want.Containers = []api.ContainerAssignment{{Name: "helper", Shared: &s}, {Name: "train", GPUs: []api.GPURef{{UUID: uuid0, Index: 0}}}}
	if diff := cmp.Diff(want, get("p")); diff != "" {
		t.Errorf("pod p (-want +got):\n%s", diff)
	}
	want.Containers = []api.ContainerAssignment{{Name: "helper", Shared: &s}}
	if diff := cmp.Diff(want, get("q")); diff != "" {
		t.Errorf("pod q (-want +got):\n%s", diff)
	}
	// Recording again is idempotent; a different slice for the same
	// container is refused; so is a pod that was replaced.
	if err := r.RecordShared(ctx, Pod{Namespace: "ns", Name: "q", UID: "uid-q"}, "helper", s); err != nil {
		t.Errorf("recording the same slice again: %v", err)
	}
	other := s
	other.GPU = api.GPURef{UUID: uuid3, Index: 3}
	if err := r.RecordShared(ctx, Pod{Namespace: "ns", Name: "q", UID: "uid-q"}, "helper", other); err == nil || !strings.Contains(err.Error(), "already has a shared assignment") {
		t.Errorf("conflicting slice: %v", err)
	}
	if err := r.RecordShared(ctx, Pod{Namespace: "ns", Name: "q", UID: "uid-old"}, "helper", s); err == nil || !strings.Contains(err.Error(), "is now another pod") {
		t.Errorf("replaced pod: %v", err)
	}
}

func TestOptionsFromConfig(t *testing.T) {
	cfg := api.NewNodeAgentConfig()
	cfg.MemoryReserveMiB = 512
	pipe := func(uuid string) string { return "/mps/" + uuid }
	o := OptionsFromConfig(cfg, 508, pipe, nil)
	if !o.CDI || o.CDIKind != api.DefaultCDIKind || o.CDIDeviceName != api.CDINameUUID || o.MemoryUnitMiB != 1024 || o.MemoryReserveMiB != 512 || o.UVMMajor != 508 || o.MPSPipeDir("x") != "/mps/x" {
		t.Errorf("default config: %+v", o)
	}
	if o.NonGPU.Leave || len(o.NonGPU.ExemptNamespaces) != 0 {
		t.Errorf("default config: containers without a Tessera GPU are not voided: %+v", o.NonGPU)
	}
	cfg.DeviceListStrategy = []string{api.DeviceListEnvvar}
	if o := OptionsFromConfig(cfg, 508, pipe, nil); o.CDI {
		t.Error("envvar strategy yields CDI devices; want device nodes")
	}
	// The operator's choice reaches Decide.
	cfg.NRI = api.NRIConfig{NonGPUContainers: api.NonGPUContainersLeave, NonGPUExemptNamespaces: []string{"gpu-operator"}}
	if o := OptionsFromConfig(cfg, 508, pipe, nil); !o.NonGPU.Leave || len(o.NonGPU.ExemptNamespaces) != 1 || o.NonGPU.ExemptNamespaces[0] != "gpu-operator" {
		t.Errorf("nri config not passed on: %+v", o.NonGPU)
	}
}

func TestHealthFromInventory(t *testing.T) {
	inv := &api.GPUInventory{GPUs: []api.InventoryGPU{{UUID: uuid0, Healthy: true}, {UUID: uuid1, Reason: "XID 79"}}}
	got := HealthFromInventory(func() *api.GPUInventory { return inv }).Unhealthy()
	if diff := cmp.Diff(map[string]string{uuid1: "XID 79"}, got); diff != "" {
		t.Errorf("unhealthy (-want +got):\n%s", diff)
	}
}

func TestPodOfKeepsOnlySealedDecisions(t *testing.T) {
	a := api.NewAssignment()
	a.Containers = []api.ContainerAssignment{{Name: "c", Shared: &api.SharedGPU{GPU: api.GPURef{UUID: uuid2, Index: 2}, MemoryMiB: 1024}}}
	value, err := api.EncodeAssignment(a)
	if err != nil {
		t.Fatal(err)
	}
	tenant := map[string]string{api.AnnotationAssignment: value, "user": "x"}
	for _, tc := range []struct {
		name  string
		trust *podtrust.Filter
		sb    *adaptation.PodSandbox
		kept  bool
	}{
		{"sealed", testTrust(), sandbox("p", map[string]string{api.AnnotationAssignment: value, "user": "x"}), true},
		{"a tenant's", testTrust(), unsealedSandbox("p", tenant), false},
		{"sealed for another pod", testTrust(), func() *adaptation.PodSandbox {
			sb := sandbox("q", map[string]string{api.AnnotationAssignment: value, "user": "x"})
			sb.Uid = "uid-p"
			return sb
		}(), false},
		{"no key", nil, sandbox("p", map[string]string{api.AnnotationAssignment: value, "user": "x"}), false},
	} {
		p := &Plugin{cfg: Config{Trust: tc.trust}, logger: klog.Background()}
		pod := p.podOf(tc.sb)
		if _, ok := pod.Annotations[api.AnnotationAssignment]; ok != tc.kept || pod.Annotations["user"] != "x" {
			t.Errorf("%s: annotations %v, want the assignment kept=%v and the user's own", tc.name, pod.Annotations, tc.kept)
		}
		if _, ok := tc.sb.Annotations[api.AnnotationAssignment]; !ok {
			t.Errorf("%s: the sandbox's own annotations were changed", tc.name)
		}
	}
}
