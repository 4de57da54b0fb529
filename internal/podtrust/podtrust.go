// Package podtrust removes from the pods a Tessera component reads every
// state annotation that is not Tessera's own decision for that pod
// (api.Sealer.Sanitize), and says so with a Warning Event. Components apply
// it where pods enter them: informer transforms, API reads, the
// scheduler's arguments.
package podtrust

import (
	"errors"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/gpureq"
)

// ReasonIgnored is the reason of the Warning Event for an ignored
// annotation.
const ReasonIgnored = "IgnoredAnnotation"

// EventRecorder is the part of client-go's record.EventRecorder it uses.
type EventRecorder interface {
	Eventf(object runtime.Object, eventtype, reason, messageFmt string, args ...any)
}

// errNoKey is why every state annotation is ignored by a Filter that has
// no seal key.
var errNoKey = errors.New("this component has no seal key, so it trusts no decision annotation")

// Filter sanitizes pods. The zero Filter, or one without a Sealer, trusts
// nothing: it removes every state annotation (fail closed).
type Filter struct {
	Sealer *api.Sealer
	// Events (optional) receives a Warning Event per ignored annotation.
	Events EventRecorder
	// Component names the reader in the Event.
	Component string
}

// Pod sanitizes pod in place and returns what it removed.
func (f *Filter) Pod(pod *corev1.Pod) []api.Ignored {
	if pod == nil {
		return nil
	}
	var ignored []api.Ignored
	if f == nil || f.Sealer == nil {
		ignored = f.Annotations(pod.UID, pod.Annotations)
	} else {
		ignored = f.Sealer.Sanitize(pod, gpureq.CheckAssignment)
	}
	if f != nil && f.Events != nil {
		for _, ig := range ignored {
			f.Events.Eventf(pod, corev1.EventTypeWarning, ReasonIgnored, "%s %s: only Tessera writes it, and it is not obeyed", f.Component, ig)
		}
	}
	return ignored
}

// Annotations sanitizes the annotations of the pod uid in place, for a
// reader without the pod's spec (api.Sealer.SanitizeAnnotations), and
// returns what it removed. It records no Event (it has no pod object).
func (f *Filter) Annotations(uid types.UID, annotations map[string]string) []api.Ignored {
	if f == nil || f.Sealer == nil {
		var ignored []api.Ignored
		for _, k := range api.StateAnnotations() {
			if _, ok := annotations[k]; ok {
				delete(annotations, k)
				ignored = append(ignored, api.Ignored{Annotation: k, Err: errNoKey})
			}
		}
		return ignored
	}
	return f.Sealer.SanitizeAnnotations(uid, annotations)
}

// Sealed returns the decision annotation name holding value on the pod uid
// with its seal (api.Sealer.Annotations), for a writer to patch; an error
// when the Filter has no key (it then writes nothing Tessera would trust).
func (f *Filter) Sealed(uid types.UID, name, value string) (map[string]string, error) {
	if f == nil || f.Sealer == nil {
		return nil, errors.New("no seal key")
	}
	return f.Sealer.Annotations(uid, name, value), nil
}

// Quiet returns a Filter with the same key that records no Events: for
// repeated reads of pods the informer's Filter already reported.
func (f *Filter) Quiet() *Filter {
	if f == nil {
		return nil
	}
	return &Filter{Sealer: f.Sealer, Component: f.Component}
}

// Transform is an informer transform (SetTransform): it drops managed
// fields (no component reads them; they are a large part of a pod) and
// sanitizes pods.
func (f *Filter) Transform(obj any) (any, error) {
	if a, ok := obj.(interface {
		SetManagedFields([]metav1.ManagedFieldsEntry)
	}); ok {
		a.SetManagedFields(nil)
	}
	if p, ok := obj.(*corev1.Pod); ok {
		f.Pod(p)
	}
	return obj, nil
}
