package admission

import (
	"context"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/tessera-gpu/tessera/api"
)

// TestHintsCheckedOnUpdate: deploy/admission's tessera-hints refuses a
// tenant's update that writes a malformed run-time hint on its pod (the
// gang webhook checks them at creation only: "perhaps" written later was
// read silently as absent), says which and why, and lets well-formed
// values and updates that leave a hint alone pass.
func TestHintsCheckedOnUpdate(t *testing.T) {
	e := start(t)
	ctx := t.Context()
	// Created with a hint malformed already (no gang webhook here), as a
	// pod admitted before the policy existed.
	old := testPod("hinted", map[string]string{api.AnnotationPreemptible: "perhaps"})
	if _, err := e.tenant.CoreV1().Pods(tenantNS).Create(ctx, old, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	patch := func(ctx context.Context, key, value string, opts metav1.PatchOptions) error {
		p := `{"metadata":{"annotations":{"` + key + `":"` + value + `"}}}`
		_, err := e.tenant.CoreV1().Pods(tenantNS).Patch(ctx, "hinted", types.MergePatchType, []byte(p), opts)
		return err
	}
	annotate := func(ctx context.Context, key, value string) error {
		return patch(ctx, key, value, metav1.PatchOptions{})
	}
	// The admission plugin loads the policy a little after install: probe
	// with dry runs, which write nothing (a probe that got through before
	// would make the value unchanged, and so allowed, after).
	var last error
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		last = patch(ctx, api.AnnotationNUMAAlignment, "flase", metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
		return last != nil, nil
	}); err != nil {
		t.Fatalf("tessera-hints is not enforced: %v (last update: %v)", err, last)
	}
	for _, c := range []struct {
		key, value, want string // want "" for allowed
	}{
		{api.AnnotationNUMAAlignment, "flase", `annotation tessera.dev/numa-alignment: "flase" is none of "true", "enabled", "false"`},
		{api.AnnotationNUMAAlignment, "false", ""},
		{api.AnnotationExpectedRuntime, "forever", `annotation tessera.dev/expected-runtime: "forever" is not a duration of hours, minutes and seconds above 0`},
		{api.AnnotationExpectedRuntime, "500ms", `is not a duration`},
		{api.AnnotationExpectedRuntime, "0m", `is not a duration`},
		{api.AnnotationExpectedRuntime, "2h30m", ""},
		{api.AnnotationPreemptible, "maybe", `annotation tessera.dev/preemptible: "maybe" is neither "true" nor "false"`},
		{api.AnnotationPreemptible, "true", ""},
		// A label change leaves the hints as they are: passes.
		{"team", "b", ""},
	} {
		err := annotate(ctx, c.key, c.value)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s=%s refused: %v", c.key, c.value, err)
		case c.want != "" && (err == nil || !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s=%s: error %v, want Invalid saying %q", c.key, c.value, err, c.want)
		}
	}
}

// TestHintsFixedOnceBound: once a pod is bound, tessera-hints refuses any
// change or removal of tessera.dev/expected-runtime and
// tessera.dev/preemptible, the terms a reservation backfills and evicts by
// (on make demo a tenant rewrote them after its pods were backfilled onto
// a reserved node, and the reservation never evicted them). Before the
// bind they may change; numa-alignment may change after it too.
func TestHintsFixedOnceBound(t *testing.T) {
	e := start(t)
	ctx := t.Context()
	hints := map[string]string{api.AnnotationExpectedRuntime: "1m", api.AnnotationPreemptible: "true"}
	if _, err := e.tenant.CoreV1().Pods(tenantNS).Create(ctx, testPod("backfill", hints), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	patch := func(ctx context.Context, annotations string, opts metav1.PatchOptions) error {
		_, err := e.tenant.CoreV1().Pods(tenantNS).Patch(ctx, "backfill", types.MergePatchType, []byte(`{"metadata":{"annotations":`+annotations+`}}`), opts)
		return err
	}
	// Pending: the hints may change (the same value back, so the pod
	// keeps its terms for what follows).
	for _, a := range []string{`{"tessera.dev/expected-runtime":"2m"}`, `{"tessera.dev/expected-runtime":"1m"}`} {
		if err := patch(ctx, a, metav1.PatchOptions{}); err != nil {
			t.Fatalf("pending pod: %s refused: %v", a, err)
		}
	}
	if err := e.admin.CoreV1().Pods(tenantNS).Bind(ctx, &v1.Binding{ObjectMeta: metav1.ObjectMeta{Name: "backfill", Namespace: tenantNS}, Target: v1.ObjectReference{Kind: "Node", Name: "n1"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The admission plugin loads the policy a little after install: probe
	// with dry runs.
	var last error
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		last = patch(ctx, `{"tessera.dev/expected-runtime":"100h"}`, metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
		return last != nil, nil
	}); err != nil {
		t.Fatalf("tessera-hints does not fix a bound pod's hints: %v (last update: %v)", err, last)
	}
	for _, c := range []struct {
		annotations, want string // want "" for allowed
	}{
		{`{"tessera.dev/expected-runtime":"100h"}`, `annotation tessera.dev/expected-runtime cannot be changed or removed once the pod is bound`},
		{`{"tessera.dev/expected-runtime":null}`, `annotation tessera.dev/expected-runtime cannot be changed`},
		{`{"tessera.dev/preemptible":"false"}`, `annotation tessera.dev/preemptible cannot be changed`},
		{`{"tessera.dev/preemptible":null}`, `annotation tessera.dev/preemptible cannot be changed`},
		{`{"tessera.dev/numa-alignment":"false"}`, ""},
		{`{"tessera.dev/expected-runtime":"1m","team":"b"}`, ""},
	} {
		err := patch(ctx, c.annotations, metav1.PatchOptions{})
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s refused: %v", c.annotations, err)
		case c.want != "" && (err == nil || !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: error %v, want it refused saying %q", c.annotations, err, c.want)
		}
	}
	p, err := e.admin.CoreV1().Pods(tenantNS).Get(ctx, "backfill", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Annotations[api.AnnotationExpectedRuntime] != "1m" || p.Annotations[api.AnnotationPreemptible] != "true" {
		t.Errorf("bound pod's hints changed: %v", p.Annotations)
	}
}
