package admission

import (
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/tessera-gpu/tessera/api"
)

// TestQuotasCountUnitsNotBytes: an ElasticQuota or a Queue that gives a
// Tessera resource in bytes (a binary suffix: "24Gi" of gpu-memory is
// 25,769,803,776 units, a cap that caps nothing) is refused by deploy/crds
// with a message that says how to write it; the same suffix on memory, and
// plain counts, pass.
func TestQuotasCountUnitsNotBytes(t *testing.T) {
	e := start(t)
	ctx := t.Context()
	const mem = "tessera.dev/gpu-memory"
	eqs := e.adminDyn.Resource(schema.GroupVersionResource{Group: "scheduling.x-k8s.io", Version: "v1alpha1", Resource: "elasticquotas"}).Namespace(tenantNS)
	queues := e.adminDyn.Resource(api.QueueGVR)
	bad := []struct {
		name string
		obj  *unstructured.Unstructured
		want string
	}{
		{"quota max in bytes", quota("q", nil, map[string]any{mem: "24Gi", "tessera.dev/gpu": "100"}),
			`spec.max: Invalid value: "object": tessera.dev/gpu-memory: 24Gi is not a count: Tessera resources count GPUs, memory units or MIG instances: write a whole number without a suffix, such as 24 (tessera.dev/gpu-memory counts units of 1 GiB by default, not bytes)`},
		{"quota max in decimal bytes", quota("q", nil, map[string]any{mem: "24G"}),
			`spec.max: Invalid value: "object": tessera.dev/gpu-memory: 24G is not a count`},
		{"quota max a fraction", quota("q", nil, map[string]any{mem: "1500m"}),
			`spec.max: Invalid value: "object": tessera.dev/gpu-memory: 1500m is not a count`},
		{"quota min in bytes", quota("q", map[string]any{"tessera.dev/mig-1g.5gb": "2Ki"}, nil),
			`spec.min: Invalid value: "object": tessera.dev/mig-1g.5gb: 2Ki is not a count`},
		{"queue limit in bytes", queueObj("q", map[string]any{"resources": map[string]any{mem: map[string]any{"limit": "24Gi"}}}),
			`spec.resources[tessera.dev/gpu-memory].limit: Invalid value: "": 24Gi is not a count: queues count GPUs, memory units or MIG instances: write a whole number without a suffix`},
		{"queue limit in decimal bytes", queueObj("q", map[string]any{"resources": map[string]any{"tessera.dev/mig-1g.5gb": map[string]any{"limit": "24G"}}}),
			`spec.resources[tessera.dev/mig-1g.5gb].limit: Invalid value: "": 24G is not a count`},
		{"queue guarantee in bytes", queueObj("q", map[string]any{"resources": map[string]any{mem: map[string]any{"guaranteed": "1Mi"}}}),
			`spec.resources[tessera.dev/gpu-memory].guaranteed: Invalid value: "": 1Mi is not a count`},
	}
	for _, c := range bad {
		t.Run(c.name, func(t *testing.T) {
			ri := eqs
			if c.obj.GetKind() == api.QueueKind {
				ri = queues
			}
			_, err := ri.Create(ctx, c.obj, metav1.CreateOptions{})
			if err == nil {
				t.Fatalf("created; want refused with %q", c.want)
			}
			if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q\nwant Invalid saying %q", err, c.want)
			}
		})
	}
	if _, err := eqs.Create(ctx, quota("counts", map[string]any{"memory": "24Gi", "cpu": "1500m", mem: "24"}, map[string]any{"memory": "64Gi", mem: int64(48), "tessera.dev/gpu": "1e3"}), metav1.CreateOptions{}); err != nil {
		t.Errorf("quota of counts and memory in bytes refused: %v", err)
	}
	if _, err := queues.Create(ctx, queueObj("counts", map[string]any{"resources": map[string]any{mem: map[string]any{"guaranteed": "24", "limit": "1e3"}}}), metav1.CreateOptions{}); err != nil {
		t.Errorf("queue of counts refused: %v", err)
	}
}

// TestPodGroupSizesAreInt32: a PodGroup's minMember is required and, like
// scheduleTimeoutSeconds, an int32 (the CRD's format alone checks
// nothing): the API server refuses the values the extender would refuse
// later (a PodGroup with spec {} or minMember 99999999999 was accepted).
func TestPodGroupSizesAreInt32(t *testing.T) {
	e := start(t)
	ctx := t.Context()
	pgs := e.adminDyn.Resource(schema.GroupVersionResource{Group: "scheduling.x-k8s.io", Version: "v1alpha1", Resource: "podgroups"}).Namespace(tenantNS)
	for _, c := range []struct {
		name string
		spec map[string]any
		want string
	}{
		{"no minMember", map[string]any{}, `spec.minMember: Required value`},
		{"minMember above int32", map[string]any{"minMember": int64(99999999999)}, `spec.minMember: Invalid value: 99999999999: spec.minMember in body should be less than or equal to 2147483647`},
		{"timeout above int32", map[string]any{"minMember": int64(2), "scheduleTimeoutSeconds": int64(1 << 31)}, `spec.scheduleTimeoutSeconds in body should be less than or equal to 2147483647`},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := pgs.Create(ctx, podGroup("pg", c.spec), metav1.CreateOptions{})
			if err == nil || !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %v, want Invalid saying %q", err, c.want)
			}
		})
	}
	if _, err := pgs.Create(ctx, podGroup("largest", map[string]any{"minMember": int64(1<<31 - 1)}), metav1.CreateOptions{}); err != nil {
		t.Errorf("minMember 2^31-1 refused: %v", err)
	}
}
