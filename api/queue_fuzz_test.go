package api_test

import (
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/tessera-gpu/tessera/api"
)

// FuzzQueueFromUnstructured decodes JSON as the dynamic client does
// (integers as int64) and parses it as a Queue and a Queue's status. Never
// a panic; an error names the queue; an accepted queue holds the CRD's
// rules and re-encodes (Queue.Unstructured) to itself; an accepted status
// re-encodes (QueueStatus.Object) to itself, its time to the second.
func FuzzQueueFromUnstructured(f *testing.F) {
	for _, seed := range []string{
		`{"metadata":{"name":"research"},"spec":{"resources":{"tessera.dev/gpu":{"guaranteed":"8","limit":16,"weight":2},"tessera.dev/gpu-memory":{"guaranteed":"1e3"}}}}`,
		`{"metadata":{"name":"team-a"},"spec":{"parent":"research","namespaces":["team-a","team-a-dev"],"resources":{"tessera.dev/gpu":{"guaranteed":"4","limit":"4","weight":0},"nvidia.com/gpu":{"weight":1000}}},` +
			`"status":{"used":{"tessera.dev/gpu":"3"},"guaranteed":{"tessera.dev/gpu":4},"fairShare":{"tessera.dev/gpu":"5"},"usage":{"tessera.dev/gpu":"12345.6"},"usageUpdated":"2026-11-24T01:00:00Z","conditions":[]}}`,
		`{"metadata":{"name":"q"}}`,
		`{"metadata":{"name":"q"},"spec":null,"status":null}`,
		`{"metadata":{"name":"q"},"spec":{"parent":"q"}}`,
		`{"metadata":{"name":"q"},"spec":{"parent":"Research_Dept"}}`,
		`{"metadata":{"name":"q"},"spec":{"namespaces":["a","a"]}}`,
		`{"metadata":{"name":"q"},"spec":{"resources":{"cpu":{}}}}`,
		`{"metadata":{"name":"q"},"spec":{"resources":{"tessera.dev/gpu":{"guaranteed":"8","limit":"4"}}}}`,
		`{"metadata":{"name":"q"},"spec":{"resources":{"tessera.dev/gpu":{"guaranteed":"500m","weight":1.5}}}}`,
		`{"metadata":{"name":"q"},"spec":{"resources":{"tessera.dev/gpu":{"limit":"1e-1011001000000020"}}}}`,
		`{"metadata":{"name":"q"},"spec":{"resources":{"tessera.dev/gpu":{"weight":1001}}}}`,
		`{"metadata":{"name":"q"},"spec":{"resources":{"tessera.dev/gpu":null}}}`,
		`{"metadata":{"name":"q"},"status":{"usage":{"tessera.dev/gpu":"NaN"},"usageUpdated":"0000-01-01T00:00:00+01:00"}}`,
		`{"metadata":{"name":"q"},"status":{"usageUpdated":"2026-11-24T01:00:00.5+02:00","usage":{"tessera.dev/gpu":"-0"}}}`,
		`{"metadata":{"name":""}}`, `[]`, `null`, `{`,
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, in string) {
		var obj map[string]any
		if err := utiljson.Unmarshal([]byte(in), &obj); err != nil || obj == nil {
			return
		}
		u := &unstructured.Unstructured{Object: obj}
		// GetName is "" for a malformed metadata (unstructured's accessors
		// do not fail); the parser then refuses the empty name.
		prefix := "Queue " + u.GetName() + ": "
		q, err := api.QueueFromUnstructured(u)
		if err != nil {
			if !strings.HasPrefix(err.Error(), prefix) {
				t.Fatalf("error %q does not name the queue (%q)", err, prefix)
			}
		} else {
			checkQueue(t, q)
			again, err := api.QueueFromUnstructured(q.Unstructured())
			if err != nil {
				t.Fatalf("re-encoded %+v: %v", q, err)
			}
			if diff := cmp.Diff(q, again); diff != "" {
				t.Fatalf("re-encoded (-first +again):\n%s", diff)
			}
		}
		s, err := api.QueueStatusFromUnstructured(u)
		if err != nil {
			if !strings.HasPrefix(err.Error(), prefix) {
				t.Fatalf("status error %q does not name the queue (%q)", err, prefix)
			}
			return
		}
		for name, f := range s.Usage {
			if math.IsNaN(f) || math.IsInf(f, 0) || f < 0 {
				t.Fatalf("usage[%s] = %v accepted", name, f)
			}
		}
		for _, m := range []map[corev1.ResourceName]int64{s.Used, s.Guaranteed, s.FairShare} {
			for name, n := range m {
				if n < 0 || !slices.Contains(api.QuotaResources(), name) {
					t.Fatalf("status %s = %d accepted", name, n)
				}
			}
		}
		if !s.UsageUpdated.IsZero() && s.UsageUpdated.Location() != time.UTC {
			t.Fatalf("usageUpdated %v not in UTC", s.UsageUpdated)
		}
		back := &unstructured.Unstructured{Object: map[string]any{"metadata": map[string]any{"name": u.GetName()}, "status": s.Object()}}
		again, err := api.QueueStatusFromUnstructured(back)
		if err != nil {
			t.Fatalf("status %+v re-encoded to %v: %v", s, back.Object["status"], err)
		}
		want := s
		want.UsageUpdated = s.UsageUpdated.Truncate(time.Second)
		if diff := cmp.Diff(want, again); diff != "" {
			t.Fatalf("status re-encoded (-first +again):\n%s", diff)
		}
	})
}

// checkQueue fails unless q holds what the CRD's rules say.
func checkQueue(t *testing.T, q *api.Queue) {
	t.Helper()
	if errs := validation.IsDNS1123Subdomain(q.Name); len(errs) > 0 {
		t.Fatalf("name %q accepted: %v", q.Name, errs)
	}
	if q.Parent != "" {
		if errs := validation.IsDNS1123Subdomain(q.Parent); len(errs) > 0 || q.Parent == q.Name {
			t.Fatalf("parent %q of %q accepted: %v", q.Parent, q.Name, errs)
		}
	}
	if len(q.Namespaces) > api.MaxQueueNamespaces || !slices.IsSorted(q.Namespaces) || len(slices.Compact(slices.Clone(q.Namespaces))) != len(q.Namespaces) {
		t.Fatalf("namespaces %q accepted (want sorted, each once)", q.Namespaces)
	}
	for _, ns := range q.Namespaces {
		if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
			t.Fatalf("namespace %q accepted: %v", ns, errs)
		}
	}
	for name, r := range q.Resources {
		if !slices.Contains(api.QuotaResources(), name) {
			t.Fatalf("resource %q accepted", name)
		}
		if r.Guaranteed < 0 || r.Weight < 0 || r.Weight > api.MaxQueueWeight || r.Limited && r.Limit < r.Guaranteed || !r.Limited && r.Limit != 0 {
			t.Fatalf("resource %s: %+v accepted", name, r)
		}
	}
}
