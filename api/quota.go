package api

import (
	"encoding/json"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// ElasticQuota is the part of a scheduler-plugins ElasticQuota
// (scheduling.x-k8s.io/v1alpha1) that Tessera enforces: min is guaranteed
// to the namespace, max caps it, borrowing included.
type ElasticQuota struct {
	Namespace string
	Name      string
	Min, Max  corev1.ResourceList
}

// QuotaResources are the resources quota governs, MIG profiles' aside
// (QuotaGoverned).
func QuotaResources() []corev1.ResourceName {
	return []corev1.ResourceName{ResourceGPU, ResourceGPUMemory, ResourceGPUCore, ResourceNVIDIAGPU}
}

// QuotaGoverned reports whether ElasticQuota governs name: one of
// QuotaResources, or a MIG profile's resource (tessera.dev/mig-<profile>).
// What an ElasticQuota says of any other resource is not Tessera's to
// enforce.
func QuotaGoverned(name corev1.ResourceName) bool {
	return slices.Contains(QuotaResources(), name) || IsMIGResource(name)
}

// ElasticQuotaFromUnstructured decodes an ElasticQuota object read with a
// dynamic client. Malformed quantities are errors naming the field.
func ElasticQuotaFromUnstructured(u *unstructured.Unstructured) (*ElasticQuota, error) {
	q := &ElasticQuota{Namespace: u.GetNamespace(), Name: u.GetName()}
	for _, field := range []string{"min", "max"} {
		raw, _, err := unstructured.NestedMap(u.Object, "spec", field)
		if err != nil {
			return nil, fmt.Errorf("ElasticQuota %s/%s: spec.%s: %w", q.Namespace, q.Name, field, err)
		}
		list := corev1.ResourceList{}
		for name, v := range raw {
			s, ok := v.(string)
			if !ok {
				if n, isInt := v.(int64); isInt {
					s = fmt.Sprint(n)
				} else {
					return nil, fmt.Errorf("ElasticQuota %s/%s: spec.%s.%s: %v is not a quantity", q.Namespace, q.Name, field, name, v)
				}
			}
			qty, err := ParseQuantity(s)
			if err != nil {
				return nil, fmt.Errorf("ElasticQuota %s/%s: spec.%s.%s: %w", q.Namespace, q.Name, field, name, err)
			}
			if qty.Sign() < 0 {
				return nil, fmt.Errorf("ElasticQuota %s/%s: spec.%s.%s: %q is negative", q.Namespace, q.Name, field, name, s)
			}
			list[corev1.ResourceName(name)] = qty
		}
		if field == "min" {
			q.Min = list
		} else {
			q.Max = list
		}
	}
	for name, min := range q.Min {
		if max, capped := q.Max[name]; capped && min.Cmp(max) > 0 {
			return nil, fmt.Errorf("ElasticQuota %s/%s: spec.min.%s (%s) is above spec.max.%s (%s)", q.Namespace, q.Name, name, min.String(), name, max.String())
		}
	}
	return q, nil
}

// Event reasons of quota enforcement (on pods).
const (
	// EventQuotaExceeded: the pod (or its gang) would take its namespace
	// above its ElasticQuota max, or borrow beyond what can be lent.
	EventQuotaExceeded = "QuotaExceeded"
	// EventQuotaReclaiming: on the pods that wait within their namespace's
	// min, naming the workloads evicted to give them room.
	EventQuotaReclaiming = "QuotaReclaiming"
	// EventReclaimed: on each evicted pod, naming who needed the room and
	// why the pod's workload was chosen.
	EventReclaimed = "Reclaimed"
	// EventReclaimBlocked: a chosen workload could not be evicted (a
	// PodDisruptionBudget refused it); reclaim tries others.
	EventReclaimBlocked = "ReclaimBlocked"
)

// Event reasons of quota enforcement on ElasticQuota objects (Warning).
const (
	// EventQuotaIgnored: the ElasticQuota is not the one in force in its
	// namespace (another applies, the first by name), so nothing it says
	// is enforced.
	EventQuotaIgnored = "QuotaIgnored"
	// EventQuotaInvalid: the ElasticQuota in force in its namespace is
	// malformed, so the namespace admits nothing new until it is fixed.
	EventQuotaInvalid = "QuotaInvalid"
)

// AnnotationQuotaRequeue is written by tessera-extender on a pending pod
// that kube-scheduler found unschedulable, when an ElasticQuota change may
// now admit it: an ElasticQuota change is no event kube-scheduler reacts
// to, and a pod the extender refused would otherwise wait for the next
// unrelated cluster event or kube-scheduler's periodic flush of
// unschedulable pods (podMaxInUnschedulablePodsDuration, 5 minutes). A
// change of a pod's metadata moves it back to kube-scheduler's active or
// backoff queue. The value names the change, "NAMESPACE/NAME@RESOURCEVERSION"
// of the quota that now applies or "... deleted" for one removed (several
// joined by ", "), so that the same change is written once. Only Tessera
// writes it (deploy/admission, GuardedAnnotations); nothing reads it but
// people.
const AnnotationQuotaRequeue = Domain + "/quota-requeue"

// QuotaRequeue returns the ElasticQuota change a pod was last requeued for
// (AnnotationQuotaRequeue), if any.
func QuotaRequeue(annotations map[string]string) (string, bool) {
	v, ok := annotations[AnnotationQuotaRequeue]
	return v, ok
}

// QuotaRequeuePatch is the JSON merge patch of a pod that sets
// AnnotationQuotaRequeue to value.
func QuotaRequeuePatch(value string) []byte {
	b, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{AnnotationQuotaRequeue: value}}})
	return b
}
