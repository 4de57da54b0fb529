package podtrust

import (
	"fmt"
	"maps"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/api"
)

type events struct {
	mu  sync.Mutex
	got []string
}

func (e *events) Eventf(_ runtime.Object, typ, reason, format string, args ...any) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.got = append(e.got, typ+" "+reason+" "+fmt.Sprintf(format, args...))
}

func sealer(t *testing.T) *api.Sealer {
	t.Helper()
	s, err := api.NewSealer([]byte("podtrust-unit-test-key-0123456789"))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

const uuid = "GPU-00000000-0000-0000-0000-000000000001"

// slicePod asks for 4 memory units and 20 cores in container "c"; ann are
// its annotations.
func slicePod(ann map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "uid-p", Annotations: ann,
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
			api.ResourceGPUMemory: resource.MustParse("4"), api.ResourceGPUCore: resource.MustParse("20"),
		}}}}},
	}
}

func assignment(name string, shared *api.SharedGPU, gpus ...api.GPURef) *api.Assignment {
	a := api.NewAssignment()
	a.Containers = []api.ContainerAssignment{{Name: name, Shared: shared, GPUs: gpus}}
	return a
}

func TestFilterPod(t *testing.T) {
	s := sealer(t)
	slice := &api.SharedGPU{GPU: api.GPURef{UUID: uuid, Index: 1}, MemoryMiB: 4096, Cores: 20}
	sealed := func(uid string, a *api.Assignment) map[string]string {
		ann, err := s.AssignmentAnnotations(types.UID(uid), a)
		if err != nil {
			t.Fatal(err)
		}
		return ann
	}
	good := sealed("uid-p", assignment("c", slice))
	raw := good[api.AnnotationAssignment]
	tests := []struct {
		name    string
		ann     map[string]string
		kept    bool
		because string
	}{
		{"sealed and fits", good, true, ""},
		{"no seal", map[string]string{api.AnnotationAssignment: raw}, false, "not sealed by Tessera"},
		{"copied from another pod", sealed("uid-q", assignment("c", slice)), false, "does not match"},
		{"garbage", map[string]string{api.AnnotationAssignment: "{", api.AnnotationAssignmentSeal: s.Seal("uid-p", api.AnnotationAssignment, "{")}, false, "not valid JSON"},
		{"names a container the pod lacks", sealed("uid-p", assignment("other", slice)), false, `no container "other"`},
		{"more cores than asked", sealed("uid-p", assignment("c", &api.SharedGPU{GPU: slice.GPU, MemoryMiB: 4096, Cores: 90})), false, "90 cores but asks for 20"},
		{"whole GPUs not asked for", sealed("uid-p", assignment("c", nil, api.GPURef{UUID: uuid, Index: 1})), false, "1 whole GPUs but asks for 0"},
		{"a seal alone", map[string]string{api.AnnotationGangPlanSeal: "v1.x"}, false, "a seal without"},
		{"a tenant's plan", map[string]string{api.AnnotationGangPlan: `{"apiVersion":"tessera.dev/v1alpha1","kind":"GangPlan","gang":"g","node":"n","expires":"2030-01-01T00:00:00Z"}`}, false, "not sealed"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ev := &events{}
			f := &Filter{Sealer: s, Events: ev, Component: "test"}
			ann := map[string]string{"user": "x"}
			for k, v := range tc.ann {
				ann[k] = v
			}
			p := slicePod(ann)
			out, err := f.Transform(p)
			if err != nil {
				t.Fatal(err)
			}
			p = out.(*corev1.Pod)
			if p.ManagedFields != nil {
				t.Error("managed fields kept")
			}
			if p.Annotations["user"] != "x" {
				t.Error("the user's own annotation was removed")
			}
			_, has := p.Annotations[api.AnnotationAssignment]
			if tc.kept {
				if !has || len(ev.got) != 0 {
					t.Fatalf("kept=%v events=%v", has, ev.got)
				}
				return
			}
			for _, k := range api.StateAnnotations() {
				if _, ok := p.Annotations[k]; ok {
					t.Errorf("%s kept", k)
				}
			}
			if len(ev.got) == 0 || !strings.Contains(ev.got[0], "Warning "+ReasonIgnored) || !strings.Contains(ev.got[0], tc.because) {
				t.Errorf("events %q, want a Warning %s saying %q", ev.got, ReasonIgnored, tc.because)
			}
		})
	}
}

func TestFilterWithoutKeyTrustsNothing(t *testing.T) {
	good, err := sealer(t).AssignmentAnnotations("uid-p", assignment("c", &api.SharedGPU{GPU: api.GPURef{UUID: uuid}, MemoryMiB: 1024}))
	if err != nil {
		t.Fatal(err)
	}
	for name, f := range map[string]*Filter{"nil": nil, "no sealer": {}} {
		p := slicePod(map[string]string{api.AnnotationAssignment: good[api.AnnotationAssignment], api.AnnotationAssignmentSeal: good[api.AnnotationAssignmentSeal], "user": "x"})
		ignored := f.Pod(p)
		if diff := cmp.Diff(map[string]string{"user": "x"}, p.Annotations); diff != "" || len(ignored) != 2 {
			t.Errorf("%s: annotations (-want +got):\n%s ignored %v", name, diff, ignored)
		}
	}
	for name, f := range map[string]*Filter{"nil": nil, "no sealer": {}} {
		if ann, err := f.Sealed("uid-p", api.AnnotationAssignment, "v"); err == nil {
			t.Errorf("%s: Sealed without a key = %v", name, ann)
		}
	}
	ann, err := (&Filter{Sealer: sealer(t)}).Sealed("uid-p", api.AnnotationAssignment, good[api.AnnotationAssignment])
	if err != nil || !maps.Equal(ann, good) {
		t.Errorf("Sealed = %v, %v; want %v", ann, err, good)
	}
	if (*Filter)(nil).Quiet() != nil {
		t.Error("Quiet of nil is not nil")
	}
	if q := (&Filter{Sealer: sealer(t), Events: &events{}}).Quiet(); q.Events != nil || q.Sealer == nil {
		t.Errorf("Quiet = %+v", q)
	}
}
