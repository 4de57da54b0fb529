package api

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

func queueObject(name string, spec any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": Version, "kind": QueueKind}}
	if spec != nil {
		u.Object["spec"] = spec
	}
	u.SetName(name)
	return u
}

func TestQueueGVR(t *testing.T) {
	if got := QueueGVR.GroupVersion().String(); got != Version {
		t.Errorf("QueueGVR's group version = %s, want %s", got, Version)
	}
	if got := QueueGVR.Resource + "." + QueueGVR.Group; got != QueueCRDName {
		t.Errorf("QueueGVR names the CRD %s, want %s", got, QueueCRDName)
	}
}

func TestQueueFromUnstructured(t *testing.T) {
	gpu, mem, core, nv := string(ResourceGPU), string(ResourceGPUMemory), string(ResourceGPUCore), string(ResourceNVIDIAGPU)
	tests := []struct {
		name string
		obj  *unstructured.Unstructured
		want *Queue
	}{
		{"no spec", queueObject("root", nil), &Queue{Name: "root", Resources: map[corev1.ResourceName]QueueResource{}}},
		{"empty spec", queueObject("root", map[string]any{"parent": "", "namespaces": []any{}, "resources": map[string]any{}}),
			&Queue{Name: "root", Resources: map[corev1.ResourceName]QueueResource{}}},
		{"department", queueObject("research", map[string]any{
			"resources": map[string]any{
				gpu: map[string]any{"guaranteed": "8", "limit": int64(16), "weight": int64(2)},
				mem: map[string]any{"guaranteed": "1e3"},
			},
		}), &Queue{Name: "research", Resources: map[corev1.ResourceName]QueueResource{
			ResourceGPU:       {Guaranteed: 8, Limit: 16, Limited: true, Weight: 2},
			ResourceGPUMemory: {Guaranteed: 1000, Weight: DefaultQueueWeight},
		}}},
		{"team", queueObject("team-a", map[string]any{
			"parent":     "research",
			"namespaces": []any{"team-a-dev", "team-a"},
			"resources": map[string]any{
				gpu:  map[string]any{"guaranteed": "4", "limit": "4", "weight": int64(0)},
				core: map[string]any{"limit": "+4k"},
				nv:   map[string]any{"weight": int64(MaxQueueWeight)},
			},
		}), &Queue{Name: "team-a", Parent: "research", Namespaces: []string{"team-a", "team-a-dev"}, Resources: map[corev1.ResourceName]QueueResource{
			ResourceGPU:       {Guaranteed: 4, Limit: 4, Limited: true, Weight: 0},
			ResourceGPUCore:   {Limit: 4000, Limited: true, Weight: DefaultQueueWeight},
			ResourceNVIDIAGPU: {Weight: MaxQueueWeight},
		}}},
		{"a MIG profile", queueObject("mig", map[string]any{"resources": map[string]any{
			"tessera.dev/mig-1g.5gb": map[string]any{"guaranteed": "2", "limit": "7"},
		}}), &Queue{Name: "mig", Resources: map[corev1.ResourceName]QueueResource{
			MIGResource("1g.5gb"): {Guaranteed: 2, Limit: 7, Limited: true, Weight: DefaultQueueWeight},
		}}},
		{"limit 0", queueObject("frozen", map[string]any{"resources": map[string]any{gpu: map[string]any{"limit": "0"}}}),
			&Queue{Name: "frozen", Resources: map[corev1.ResourceName]QueueResource{ResourceGPU: {Limited: true, Weight: 1}}}},
		{"dotted parent", queueObject("a", map[string]any{"parent": "dept.example"}),
			&Queue{Name: "a", Parent: "dept.example", Resources: map[corev1.ResourceName]QueueResource{}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := QueueFromUnstructured(tc.obj)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
			// What Unstructured writes parses back to the same queue.
			again, err := QueueFromUnstructured(got.Unstructured())
			if err != nil {
				t.Fatalf("re-encoded: %v", err)
			}
			if diff := cmp.Diff(got, again); diff != "" {
				t.Errorf("re-encoded (-first +again):\n%s", diff)
			}
		})
	}
}

func TestQueueFromUnstructuredRefuses(t *testing.T) {
	gpu := string(ResourceGPU)
	res := func(entry any) map[string]any { return map[string]any{"resources": map[string]any{gpu: entry}} }
	tests := []struct {
		name string
		obj  *unstructured.Unstructured
		want string
	}{
		{"no name", queueObject("", nil), `Queue : metadata.name: "" is not a DNS-1123 subdomain`},
		{"spec not an object", queueObject("q", "x"), "Queue q: spec: string x is not an object"},
		{"unknown spec field", queueObject("q", map[string]any{"priority": int64(1)}), "Queue q: spec.priority: unknown field"},
		{"parent not a string", queueObject("q", map[string]any{"parent": int64(1)}), "Queue q: spec.parent: int64 1 is not a string"},
		{"parent not a name", queueObject("q", map[string]any{"parent": "Research_Dept"}), `Queue q: spec.parent: "Research_Dept" is not a Queue name`},
		{"own parent", queueObject("q", map[string]any{"parent": "q"}), "Queue q: spec.parent: a queue cannot be its own parent"},
		{"namespaces not a list", queueObject("q", map[string]any{"namespaces": "team-a"}), "Queue q: spec.namespaces: string team-a is not a list"},
		{"namespace not a string", queueObject("q", map[string]any{"namespaces": []any{"a", int64(3)}}), "Queue q: spec.namespaces[1]: int64 3 is not a string"},
		{"namespace not a name", queueObject("q", map[string]any{"namespaces": []any{"Team.A"}}), `Queue q: spec.namespaces[0]: "Team.A" is not a namespace name`},
		{"namespace twice", queueObject("q", map[string]any{"namespaces": []any{"a", "b", "a"}}), `Queue q: spec.namespaces[2]: namespace "a" is named twice`},
		{"too many namespaces", queueObject("q", map[string]any{"namespaces": make([]any, MaxQueueNamespaces+1)}), "Queue q: spec.namespaces: 1025 namespaces, at most 1024"},
		{"resources not an object", queueObject("q", map[string]any{"resources": []any{}}), "Queue q: spec.resources: []interface {} [] is not an object"},
		{"unknown resource", queueObject("q", map[string]any{"resources": map[string]any{"cpu": map[string]any{}}}), `Queue q: spec.resources["cpu"]: unknown resource (queues govern tessera.dev/gpu, tessera.dev/gpu-memory, tessera.dev/gpu-core, nvidia.com/gpu, tessera.dev/mig-<profile>)`},
		{"malformed MIG profile", queueObject("q", map[string]any{"resources": map[string]any{"tessera.dev/mig-9g.5gb": map[string]any{}}}), `Queue q: spec.resources["tessera.dev/mig-9g.5gb"]: unknown resource`},
		{"entry not an object", queueObject("q", res("4")), `Queue q: spec.resources["tessera.dev/gpu"]: string 4 is not an object`},
		{"unknown entry field", queueObject("q", res(map[string]any{"min": "4"})), `Queue q: spec.resources["tessera.dev/gpu"].min: unknown field`},
		{"limit not a quantity", queueObject("q", res(map[string]any{"limit": "x"})), `Queue q: spec.resources["tessera.dev/gpu"].limit: "x" is not a quantity`},
		{"limit a float", queueObject("q", res(map[string]any{"limit": 4.0})), `Queue q: spec.resources["tessera.dev/gpu"].limit: float64 4 is not a quantity`},
		{"negative guarantee", queueObject("q", res(map[string]any{"guaranteed": int64(-1)})), `Queue q: spec.resources["tessera.dev/gpu"].guaranteed: "-1" is negative`},
		{"fractional guarantee", queueObject("q", res(map[string]any{"guaranteed": "500m"})), `Queue q: spec.resources["tessera.dev/gpu"].guaranteed: "500m" is not a whole number`},
		// As the CRD's isInteger (resource.Quantity.AsInt64) says.
		{"1.0", queueObject("q", res(map[string]any{"guaranteed": "1.0"})), `"1.0" is not a whole number`},
		{"too large", queueObject("q", res(map[string]any{"limit": "1e19"})), `Queue q: spec.resources["tessera.dev/gpu"].limit: "1e19" is too large`},
		{"exponent of many digits", queueObject("q", res(map[string]any{"limit": "1e-1011001000000020"})), `"1e-1011001000000020" is not a quantity`},
		{"weight a string", queueObject("q", res(map[string]any{"weight": "1"})), `Queue q: spec.resources["tessera.dev/gpu"].weight: string 1 is not an integer`},
		{"weight above the maximum", queueObject("q", res(map[string]any{"weight": int64(1001)})), `Queue q: spec.resources["tessera.dev/gpu"].weight: 1001 is not between 0 and 1000`},
		{"negative weight", queueObject("q", res(map[string]any{"weight": int64(-1)})), `weight: -1 is not between 0 and 1000`},
		{"guaranteed above limit", queueObject("q", res(map[string]any{"guaranteed": "2k", "limit": int64(1999)})), `Queue q: spec.resources["tessera.dev/gpu"]: guaranteed (2000) must not exceed limit (1999)`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			q, err := QueueFromUnstructured(tc.obj)
			if err == nil {
				t.Fatalf("accepted as %+v; want an error containing %q", q, tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q\ndoes not contain %q", err, tc.want)
			}
		})
	}
}

func TestQueueResourceDefaults(t *testing.T) {
	q := &Queue{Name: "q", Resources: map[corev1.ResourceName]QueueResource{ResourceGPU: {Guaranteed: 2, Weight: 0}}}
	if diff := cmp.Diff(QueueResource{Guaranteed: 2}, q.Resource(ResourceGPU)); diff != "" {
		t.Errorf("named resource (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(QueueResource{Weight: DefaultQueueWeight}, q.Resource(ResourceGPUMemory)); diff != "" {
		t.Errorf("resource not named (-want +got):\n%s", diff)
	}
}

func TestQueueStatus(t *testing.T) {
	s := QueueStatus{
		Used:         map[corev1.ResourceName]int64{ResourceGPU: 3},
		Guaranteed:   map[corev1.ResourceName]int64{ResourceGPU: 4},
		FairShare:    map[corev1.ResourceName]int64{ResourceGPU: 5, ResourceGPUMemory: 80},
		Usage:        map[corev1.ResourceName]float64{ResourceGPU: 12345.6, ResourceGPUMemory: 1e-7, ResourceGPUCore: 0},
		UsageUpdated: time.Date(2026, 11, 24, 1, 0, 0, 0, time.UTC),
	}
	obj := s.Object()
	want := map[string]any{
		"used":         map[string]any{"tessera.dev/gpu": "3"},
		"guaranteed":   map[string]any{"tessera.dev/gpu": "4"},
		"fairShare":    map[string]any{"tessera.dev/gpu": "5", "tessera.dev/gpu-memory": "80"},
		"usage":        map[string]any{"tessera.dev/gpu": "12345.6", "tessera.dev/gpu-memory": "1e-07", "tessera.dev/gpu-core": "0"},
		"usageUpdated": "2026-11-24T01:00:00Z",
	}
	if diff := cmp.Diff(want, obj); diff != "" {
		t.Errorf("Object (-want +got):\n%s", diff)
	}
	u := queueObject("team-a", nil)
	u.Object["status"] = obj
	got, err := QueueStatusFromUnstructured(u)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(s, got); diff != "" {
		t.Errorf("read back (-want +got):\n%s", diff)
	}

	// No status: empty maps, zero time; Object writes empty maps.
	empty, err := QueueStatusFromUnstructured(queueObject("team-a", nil))
	if err != nil {
		t.Fatal(err)
	}
	wantEmpty := QueueStatus{Used: map[corev1.ResourceName]int64{}, Guaranteed: map[corev1.ResourceName]int64{}, FairShare: map[corev1.ResourceName]int64{}, Usage: map[corev1.ResourceName]float64{}}
	if diff := cmp.Diff(wantEmpty, empty); diff != "" {
		t.Errorf("no status (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]any{"used": map[string]any{}, "guaranteed": map[string]any{}, "fairShare": map[string]any{}, "usage": map[string]any{}}, QueueStatus{}.Object()); diff != "" {
		t.Errorf("zero Object (-want +got):\n%s", diff)
	}

	// Integers (the CRD's int-or-string) and conditions are read.
	u.Object["status"] = map[string]any{"used": map[string]any{"nvidia.com/gpu": int64(2)}, "conditions": []any{map[string]any{"type": "Ready"}}}
	if got, err := QueueStatusFromUnstructured(u); err != nil || got.Used[ResourceNVIDIAGPU] != 2 {
		t.Errorf("integer used: %+v, %v", got, err)
	}
}

func TestQueueStatusRefuses(t *testing.T) {
	tests := []struct {
		name   string
		status any
		want   string
	}{
		{"not an object", "x", "Queue team-a: status: string x is not an object"},
		{"used not an object", map[string]any{"used": "3"}, "Queue team-a: status.used: string 3 is not an object"},
		{"unknown resource", map[string]any{"fairShare": map[string]any{"cpu": "1"}}, `Queue team-a: status.fairShare["cpu"]: unknown resource`},
		{"malformed used", map[string]any{"used": map[string]any{"tessera.dev/gpu": "x"}}, `Queue team-a: status.used["tessera.dev/gpu"]: "x" is not a quantity`},
		{"negative guaranteed", map[string]any{"guaranteed": map[string]any{"tessera.dev/gpu": "-1"}}, `status.guaranteed["tessera.dev/gpu"]: "-1" is negative`},
		{"usage not a string", map[string]any{"usage": map[string]any{"tessera.dev/gpu": 1.5}}, `Queue team-a: status.usage["tessera.dev/gpu"]: float64 1.5 is not a string`},
		{"usage not a number", map[string]any{"usage": map[string]any{"tessera.dev/gpu": "lots"}}, `Queue team-a: status.usage["tessera.dev/gpu"]: "lots" is not a finite, non-negative number of resource-seconds`},
		{"usage NaN", map[string]any{"usage": map[string]any{"tessera.dev/gpu": "NaN"}}, `"NaN" is not a finite`},
		{"usage infinite", map[string]any{"usage": map[string]any{"tessera.dev/gpu": "1e400"}}, `"1e400" is not a finite`},
		{"usage negative", map[string]any{"usage": map[string]any{"tessera.dev/gpu": "-1"}}, `"-1" is not a finite, non-negative`},
		{"usageUpdated not a string", map[string]any{"usageUpdated": int64(0)}, "Queue team-a: status.usageUpdated: int64 0 is not a string"},
		{"usageUpdated not a time", map[string]any{"usageUpdated": "yesterday"}, `Queue team-a: status.usageUpdated: "yesterday" is not an RFC 3339 time`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			u := queueObject("team-a", nil)
			u.Object["status"] = tc.status
			s, err := QueueStatusFromUnstructured(u)
			if err == nil {
				t.Fatalf("accepted as %+v; want an error containing %q", s, tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q\ndoes not contain %q", err, tc.want)
			}
		})
	}
}
