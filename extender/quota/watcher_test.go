package quota_test

import (
	"context"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"

	core "github.com/tessera-gpu/tessera/allocator/quota"
	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/extender"
	"github.com/tessera-gpu/tessera/extender/quota"
)

// fakeDiscovery serves the scheduling.x-k8s.io/v1alpha1 group once
// installed is set.
type fakeDiscovery struct {
	mu        sync.Mutex
	installed bool
	calls     int
}

func (d *fakeDiscovery) ServerResourcesForGroupVersion(gv string) (*metav1.APIResourceList, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.calls++
	if !d.installed || gv != api.ElasticQuotaGVR.GroupVersion().String() {
		return nil, apierrors.NewNotFound(schema.GroupResource{Group: api.ElasticQuotaGVR.Group}, gv)
	}
	return &metav1.APIResourceList{GroupVersion: gv, APIResources: []metav1.APIResource{{Name: "elasticquotas", Namespaced: true, Kind: "ElasticQuota"}}}, nil
}

func elasticQuota(ns, name string, min, max map[string]any) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "ElasticQuota",
		"metadata": map[string]any{"namespace": ns, "name": name},
		"spec":     map[string]any{"min": min, "max": max},
	}}
}

// TestWatcherMissingCRD: without the CRD the watcher is decided at
// once with no quotas (the extender gets ready and enforces nothing);
// once the CRD appears the quotas are picked up without a restart, and
// dropped when it is removed.
func TestWatcherMissingCRD(t *testing.T) {
	scheme := runtime.NewScheme()
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(scheme,
		map[schema.GroupVersionResource]string{api.ElasticQuotaGVR: "ElasticQuotaList"},
		elasticQuota("a", "q", map[string]any{"tessera.dev/gpu": "16"}, map[string]any{"tessera.dev/gpu": "32", "cpu": "100"}))
	disc := &fakeDiscovery{}
	changed := make(chan struct{}, 10)
	crd := &extender.CRDWatcher{Dynamic: dyn, Discovery: disc, Retry: 20 * time.Millisecond, Resource: api.ElasticQuotaGVR, Kind: "ElasticQuota", OnChange: func() { changed <- struct{}{} }}
	w := &quota.Watcher{Store: crd}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go crd.Run(ctx)
	waitFor(t, "decided without the CRD", crd.Decided)
	if got := w.Quotas(); len(got) != 0 {
		t.Errorf("quotas without the CRD: %v", got)
	}
	waitFor(t, "a second look for the CRD", func() bool { disc.mu.Lock(); defer disc.mu.Unlock(); return disc.calls >= 2 })
	disc.mu.Lock()
	disc.installed = true
	disc.mu.Unlock()
	waitFor(t, "the quota picked up", func() bool { return len(w.Quotas()) == 1 })
	want := map[string]core.Quota{"a": {Namespace: "a", Min: gpus(16), Max: gpus(32)}}
	if diff := cmp.Diff(want, w.Quotas()); diff != "" {
		t.Errorf("quotas (-want +got):\n%s", diff)
	}
	select {
	case <-changed:
	case <-time.After(5 * time.Second):
		t.Error("no OnChange for the quota")
	}
	// The CRD goes: no quotas; it comes back: picked up again.
	disc.mu.Lock()
	disc.installed = false
	disc.mu.Unlock()
	waitFor(t, "the quotas dropped with the CRD", func() bool { return len(w.Quotas()) == 0 })
	disc.mu.Lock()
	disc.installed = true
	disc.mu.Unlock()
	waitFor(t, "the quota picked up again", func() bool { return len(w.Quotas()) == 1 })
}

func TestDecode(t *testing.T) {
	objs := []*unstructured.Unstructured{
		elasticQuota("a", "z-second", map[string]any{"tessera.dev/gpu": "1"}, nil),
		elasticQuota("a", "first", map[string]any{"tessera.dev/gpu": "8", "nvidia.com/gpu": "2"}, map[string]any{"tessera.dev/gpu-memory": "80", "tessera.dev/mig-1g.5gb": "2", "cpu": "4"}),
		elasticQuota("b", "bad", map[string]any{"tessera.dev/gpu": "lots"}, nil),
		elasticQuota("c", "inverted", map[string]any{"tessera.dev/gpu": "8"}, map[string]any{"tessera.dev/gpu": "4"}),
	}
	got, errs := quota.Decode(objs)
	// A malformed quota governs its namespace and admits nothing: it must
	// not leave the namespace unlimited.
	invalid := func(ns string) core.Quota {
		return core.Quota{Namespace: ns, Min: core.Resources{}, Max: core.Resources{}, Invalid: errs[ns+"/"+map[string]string{"b": "bad", "c": "inverted"}[ns]].Error()}
	}
	want := map[string]core.Quota{"a": {Namespace: "a",
		Min: core.Resources{api.ResourceGPU: 8, api.ResourceNVIDIAGPU: 2}, Max: core.Resources{api.ResourceGPUMemory: 80, api.ResourceMIGPrefix + "1g.5gb": 2}},
		"b": invalid("b"), "c": invalid("c")}
	if errs["c/inverted"] == nil || !strings.Contains(errs["c/inverted"].Error(), "above spec.max") {
		t.Fatalf("inverted: %v", errs["c/inverted"])
	}
	st := &core.State{Quotas: got, Used: map[string]core.Resources{}, Capacity: gpus(64)}
	if d := st.Admit("c", gpus(1)); d.Allowed || !strings.Contains(d.Reason, "c's quota is invalid") || !strings.Contains(d.Reason, "above spec.max") {
		t.Errorf("admission under an inverted quota: %+v", d)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("quotas (-want +got):\n%s", diff)
	}
	// A MIG profile's max is enforced (it was dropped before 2026-11-29:
	// a namespace capped at 2 instances ran as many as it liked).
	mig := corev1.ResourceName(api.ResourceMIGPrefix + "1g.5gb")
	st = &core.State{Quotas: got, Used: map[string]core.Resources{"a": {mig: 2}}, Capacity: core.Resources{mig: 56}}
	if d := st.Admit("a", core.Resources{mig: 1}); d.Allowed || !strings.Contains(d.Reason, string(mig)) {
		t.Errorf("a third %s instance under a max of 2: %+v", mig, d)
	}
	var keys []string
	for k := range errs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	if diff := cmp.Diff([]string{"a/z-second", "b/bad", "c/inverted"}, keys); diff != "" {
		t.Errorf("errors (-want +got):\n%s (%v)", diff, errs)
	}
	if err := errs["a/z-second"]; err == nil || !strings.Contains(err.Error(), "namespace a already has one, first, which applies") {
		t.Errorf("duplicate: %v", err)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
