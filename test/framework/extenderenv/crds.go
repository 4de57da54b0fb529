package extenderenv

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"

	"github.com/tessera-gpu/tessera/api"
)

var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// Dynamic is an admin dynamic client.
func (e *Env) Dynamic(t testing.TB) dynamic.Interface {
	t.Helper()
	d, err := dynamic.NewForConfig(e.CP.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// InstallSchedulerPluginsCRDs installs the scheduler-plugins CRDs Tessera
// reads, PodGroup and ElasticQuota (scheduling.x-k8s.io/v1alpha1,
// namespaced), and waits until both are served. Their schemas keep every
// field (x-kubernetes-preserve-unknown-fields): the tests check what the
// extender makes of the objects, not the CRDs' validation.
func (e *Env) InstallSchedulerPluginsCRDs(t testing.TB) {
	t.Helper()
	d := e.Dynamic(t)
	for _, gvr := range []schema.GroupVersionResource{api.PodGroupGVR, api.ElasticQuotaGVR} {
		kind := map[string]string{"podgroups": "PodGroup", "elasticquotas": "ElasticQuota"}[gvr.Resource]
		crd := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "apiextensions.k8s.io/v1",
			"kind":       "CustomResourceDefinition",
			"metadata":   map[string]any{"name": gvr.Resource + "." + gvr.Group},
			"spec": map[string]any{
				"group": gvr.Group,
				"scope": "Namespaced",
				"names": map[string]any{"plural": gvr.Resource, "singular": strings.ToLower(kind), "kind": kind, "listKind": kind + "List"},
				"versions": []any{map[string]any{
					"name": gvr.Version, "served": true, "storage": true,
					"schema": map[string]any{"openAPIV3Schema": map[string]any{
						"type": "object", "x-kubernetes-preserve-unknown-fields": true,
					}},
					"subresources": map[string]any{"status": map[string]any{}},
				}},
			},
		}}
		if _, err := d.Resource(crdGVR).Create(t.Context(), crd, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("create CRD %s: %v", crd.GetName(), err)
		}
		// Served once a list works.
		err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			_, err := d.Resource(gvr).Namespace(DefaultNamespace).List(ctx, metav1.ListOptions{})
			return err == nil, nil
		})
		if err != nil {
			t.Fatalf("CRD %s not served: %v", crd.GetName(), err)
		}
	}
}

// CreatePodGroup creates PodGroup ns/name with spec.minMember and, when
// timeoutSeconds > 0, spec.scheduleTimeoutSeconds (the CRDs must be
// installed: InstallSchedulerPluginsCRDs). Its members carry the label
// api.LabelPodGroup=name (PodSpec.Labels) and the gang gate
// (PodSpec.Gated).
func (e *Env) CreatePodGroup(t testing.TB, ns, name string, minMember, timeoutSeconds int) {
	t.Helper()
	spec := map[string]any{"minMember": int64(minMember)}
	if timeoutSeconds > 0 {
		spec["scheduleTimeoutSeconds"] = int64(timeoutSeconds)
	}
	pg := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": api.PodGroupGVR.GroupVersion().String(),
		"kind":       "PodGroup",
		"metadata":   map[string]any{"name": name, "namespace": ns},
		"spec":       spec,
	}}
	if _, err := e.Dynamic(t).Resource(api.PodGroupGVR).Namespace(ns).Create(t.Context(), pg, metav1.CreateOptions{}); err != nil {
		t.Fatal(fmt.Errorf("create PodGroup %s/%s: %w", ns, name, err))
	}
}
