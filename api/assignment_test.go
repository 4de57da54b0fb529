package api_test

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tessera-gpu/tessera/api"
)

const (
	uuid0 = "GPU-11111111-2222-3333-4444-555555555555"
	uuid1 = "GPU-66666666-7777-8888-9999-000000000000"
)

// assignment builds an Assignment from container entries.
func assignment(cs ...api.ContainerAssignment) *api.Assignment {
	a := api.NewAssignment()
	a.Containers = append(a.Containers, cs...)
	return a
}

func whole(name string, refs ...api.GPURef) api.ContainerAssignment {
	return api.ContainerAssignment{Name: name, GPUs: refs}
}

func shared(name string, ref api.GPURef, mem, cores int64) api.ContainerAssignment {
	return api.ContainerAssignment{Name: name, Shared: &api.SharedGPU{GPU: ref, MemoryMiB: mem, Cores: cores}}
}

func TestAssignmentRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   *api.Assignment
	}{
		{"empty", assignment()},
		{"whole", assignment(whole("train", api.GPURef{UUID: uuid0, Index: 0}, api.GPURef{UUID: uuid1, Index: 1}))},
		{"shared", assignment(shared("infer", api.GPURef{UUID: uuid1, Index: 1}, 4096, 30))},
		{"both containers", assignment(whole("a", api.GPURef{UUID: uuid0}), shared("b", api.GPURef{UUID: uuid1, Index: 1}, 0, 50))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ann := map[string]string{"other": "kept"}
			if err := api.SetAssignment(ann, tc.in); err != nil {
				t.Fatalf("SetAssignment: %v", err)
			}
			got, ok, err := api.GetAssignment(ann)
			if err != nil || !ok {
				t.Fatalf("GetAssignment = ok %v, err %v; want the assignment", ok, err)
			}
			if diff := cmp.Diff(tc.in, got); diff != "" {
				t.Errorf("round trip (-want +got):\n%s", diff)
			}
			if ann["other"] != "kept" {
				t.Errorf("SetAssignment touched another annotation: %v", ann)
			}
		})
	}
}

func TestGetAssignmentAbsent(t *testing.T) {
	a, ok, err := api.GetAssignment(map[string]string{"x": "y"})
	if a != nil || ok || err != nil {
		t.Errorf("GetAssignment(no annotation) = %v, %v, %v; want nil, false, nil", a, ok, err)
	}
}

func TestParseAssignmentErrors(t *testing.T) {
	for _, tc := range []struct {
		name, value, want string
	}{
		{"empty", "", "empty value"},
		{"not json", "{", "not valid JSON"},
		{"trailing", `{"apiVersion":"tessera.dev/v1alpha1","kind":"Assignment","containers":[]} x`, "trailing data"},
		{"unknown field", `{"apiVersion":"tessera.dev/v1alpha1","kind":"Assignment","containers":[],"extra":1}`, `unknown field "extra"`},
		{"old version", `{"apiVersion":"tessera.dev/v0","kind":"Assignment","containers":[]}`, `apiVersion: must be "tessera.dev/v1alpha1"`},
		{"wrong kind", `{"apiVersion":"tessera.dev/v1alpha1","kind":"Pod","containers":[]}`, `kind: must be "Assignment"`},
		{"no name", `{"apiVersion":"tessera.dev/v1alpha1","kind":"Assignment","containers":[{"name":""}]}`, "containers[0].name: must not be empty"},
		{"duplicate container", `{"apiVersion":"tessera.dev/v1alpha1","kind":"Assignment","containers":[{"name":"a"},{"name":"a"}]}`, `containers[1].name: container "a" is also containers[0]`},
		{"bad uuid", `{"apiVersion":"tessera.dev/v1alpha1","kind":"Assignment","containers":[{"name":"a","gpus":[{"uuid":"gpu0","index":0}]}]}`, `containers[0].gpus[0].uuid: "gpu0" is not a GPU UUID`},
		{"negative index", `{"apiVersion":"tessera.dev/v1alpha1","kind":"Assignment","containers":[{"name":"a","gpus":[{"uuid":"` + uuid0 + `","index":-1}]}]}`, "containers[0].gpus[0].index: must be 0 or more"},
		{"gpu twice", `{"apiVersion":"tessera.dev/v1alpha1","kind":"Assignment","containers":[{"name":"a","gpus":[{"uuid":"` + uuid0 + `","index":0},{"uuid":"` + uuid0 + `","index":0}]}]}`, "is listed twice"},
		{"cores over 100", `{"apiVersion":"tessera.dev/v1alpha1","kind":"Assignment","containers":[{"name":"a","shared":{"gpu":{"uuid":"` + uuid0 + `","index":0},"cores":101}}]}`, "containers[0].shared.cores: must be 0..100"},
		{"empty share", `{"apiVersion":"tessera.dev/v1alpha1","kind":"Assignment","containers":[{"name":"a","shared":{"gpu":{"uuid":"` + uuid0 + `","index":0}}}]}`, "must give memoryMiB or cores"},
		{"shared and whole one gpu", `{"apiVersion":"tessera.dev/v1alpha1","kind":"Assignment","containers":[{"name":"a","gpus":[{"uuid":"` + uuid0 + `","index":0}],"shared":{"gpu":{"uuid":"` + uuid0 + `","index":0},"cores":10}}]}`, "also one of the container's whole GPUs"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, ok, err := api.GetAssignment(map[string]string{api.AnnotationAssignment: tc.value})
			if !ok {
				t.Errorf("GetAssignment: ok = false for a present annotation")
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("GetAssignment(%s) error = %v, want one containing %q", tc.value, err, tc.want)
			}
			if !strings.Contains(err.Error(), api.AnnotationAssignment) {
				t.Errorf("error %q does not name the annotation", err)
			}
		})
	}
}

func TestSetAssignmentRejectsInvalidAndKeepsOld(t *testing.T) {
	ann := map[string]string{api.AnnotationAssignment: "old"}
	bad := assignment(whole("a", api.GPURef{UUID: "nope"}))
	if err := api.SetAssignment(ann, bad); err == nil {
		t.Fatal("SetAssignment(invalid) = nil, want an error")
	}
	if ann[api.AnnotationAssignment] != "old" {
		t.Errorf("SetAssignment(invalid) changed the annotation to %q", ann[api.AnnotationAssignment])
	}
}

func TestAssignmentContainer(t *testing.T) {
	a := assignment(whole("a", api.GPURef{UUID: uuid0}), shared("b", api.GPURef{UUID: uuid1, Index: 1}, 1024, 0))
	if c := a.Container("b"); c == nil || c.Shared == nil || c.Shared.GPU.UUID != uuid1 {
		t.Errorf("Container(b) = %+v, want b's shared entry", c)
	}
	if c := a.Container("zz"); c != nil {
		t.Errorf("Container(zz) = %+v, want nil", c)
	}
}
