package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/test/framework/nodesim"
)

// TestQuotaRaiseRequeuesRefusedPod: a pod the extender refused for its
// namespace's ElasticQuota max is bound within seconds of the max being
// raised, on an otherwise quiet cluster. kube-scheduler does not watch
// ElasticQuotas: before, the pod waited in its unschedulable pool for an
// unrelated cluster event or the periodic flush
// (podMaxInUnschedulablePodsDuration, 5 minutes; make demo: bound 316 s
// after the raise). The extender now writes tessera.dev/quota-requeue on
// such pods, naming the change. A second ElasticQuota in the namespace is
// ignored with a QuotaIgnored Warning Event on it (before: a log line).
func TestQuotaRaiseRequeuesRefusedPod(t *testing.T) {
	c := getCluster(t)
	client := c.Client()
	dyn := dynamicClient(t, c)
	eqs := dyn.Resource(nodesim.ElasticQuotaGVR)
	ns := namespace(t, c, "e2e-quota-requeue")
	elasticQuota(t, c, ns, api.ResourceGPU, 0, 2)
	time.Sleep(time.Second) // the extender's informer sees the quota
	for i := range 2 {
		create(t, client, ns, podSpec{name: fmt.Sprintf("r%d", i), gpus: 1})
	}
	for i := range 2 {
		waitRunning(t, c, ns, fmt.Sprintf("r%d", i), 60*time.Second)
	}
	create(t, client, ns, podSpec{name: "r2", gpus: 1})
	var msg string
	if err := wait.PollUntilContextTimeout(t.Context(), 250*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		p := getPod(t, client, ns, "r2")
		if p.Spec.NodeName != "" {
			return false, fmt.Errorf("bound to %s above the quota's max", p.Spec.NodeName)
		}
		for _, cond := range p.Status.Conditions {
			if cond.Type == v1.PodScheduled && cond.Status == v1.ConditionFalse && cond.Reason == v1.PodReasonUnschedulable {
				msg = cond.Message
			}
		}
		return strings.Contains(msg, "ElasticQuota max is 2"), nil
	}); err != nil {
		t.Fatalf("r2 (a third GPU over a max of 2) should be refused for quota: %v (PodScheduled: %q)\n%s", err, msg, waitingPods(t, c, ns))
	}

	// F9: a second ElasticQuota in the namespace is ignored, and says so.
	extra := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "ElasticQuota",
		"metadata": map[string]any{"name": "z-extra", "namespace": ns},
		"spec":     map[string]any{"max": map[string]any{string(api.ResourceGPU): "16"}},
	}}
	if _, err := eqs.Namespace(ns).Create(t.Context(), extra, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = eqs.Namespace(ns).Delete(context.Background(), "z-extra", metav1.DeleteOptions{}) })
	var ignored []string
	if err := wait.PollUntilContextTimeout(t.Context(), 250*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		l, err := client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=z-extra,reason=" + api.EventQuotaIgnored})
		if err != nil {
			return false, nil
		}
		ignored = nil
		for _, e := range l.Items {
			if e.Type == v1.EventTypeWarning && e.InvolvedObject.Kind == "ElasticQuota" {
				ignored = append(ignored, fmt.Sprintf("%s (x%d)", e.Message, e.Count))
			}
		}
		return len(ignored) > 0, nil
	}); err != nil {
		t.Errorf("no %s Warning Event on the second ElasticQuota z-extra: %v", api.EventQuotaIgnored, err)
	} else if !strings.Contains(ignored[0], "already has an ElasticQuota, quota, which applies") {
		t.Errorf("%s Event on z-extra: %q, want it to name quota as the one that applies", api.EventQuotaIgnored, ignored)
	}

	// Let kube-scheduler park r2 in its unschedulable pool (the pods
	// started above have stopped changing by now).
	time.Sleep(5 * time.Second)
	if p := getPod(t, client, ns, "r2"); p.Spec.NodeName != "" {
		t.Fatalf("r2 bound to %s before the raise", p.Spec.NodeName)
	}

	// F5: raise the max to 4.
	raised, err := eqs.Namespace(ns).Patch(t.Context(), "quota", types.MergePatchType,
		[]byte(`{"spec":{"max":{"tessera.dev/gpu":"4"}}}`), metav1.PatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	var bound *v1.Pod
	if err := wait.PollUntilContextTimeout(t.Context(), 250*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		bound = getPod(t, client, ns, "r2")
		return bound.Spec.NodeName != "", nil
	}); err != nil {
		t.Fatalf("r2 not bound 30 s after its namespace's max was raised from 2 to 4 (kube-scheduler's own flush of unschedulable pods takes 5 minutes): %v\n%s", err, waitingPods(t, c, ns))
	}
	t.Logf("r2 bound to %s %s after the raise", bound.Spec.NodeName, time.Since(start).Round(100*time.Millisecond))
	want := ns + "/quota@" + raised.GetResourceVersion()
	if got, _ := api.QuotaRequeue(bound.Annotations); got != want {
		t.Errorf("r2's %s = %q, want %q (the change it was requeued for)", api.AnnotationQuotaRequeue, got, want)
	}
	for i := range 2 {
		if got, ok := api.QuotaRequeue(getPod(t, client, ns, fmt.Sprintf("r%d", i)).Annotations); ok {
			t.Errorf("r%d, running, was written %s = %q", i, api.AnnotationQuotaRequeue, got)
		}
	}
	waitRunning(t, c, ns, "r2", 60*time.Second)
}
