package gpureq

import (
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/tessera-gpu/tessera/api"
)

// Terminal reports whether every container of pod has stopped for good
// (phase Succeeded or Failed): what it held on its node is free.
func Terminal(pod *corev1.Pod) bool {
	return pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed
}

// Ended reports whether pod's work is over: it is Terminal, or it is being
// deleted (its containers may still be stopping, and still hold their
// devices on the node until they have).
func Ended(pod *corev1.Pod) bool {
	return pod.DeletionTimestamp != nil || Terminal(pod)
}

// EndedOn is Ended as the node agent of node sees it: a pod bound to another
// node has ended here too.
func EndedOn(pod *corev1.Pod, node string) bool {
	return Ended(pod) || pod.Spec.NodeName != node
}

// StartedAt is when a pod started: its status's start time, else its
// creation.
func StartedAt(pod *corev1.Pod) time.Time {
	if pod.Status.StartTime != nil {
		return pod.Status.StartTime.Time
	}
	return pod.CreationTimestamp.Time
}

// Unstarted reports whether the kubelet has not started pod yet (no
// status start time): a pod bound to a node may still be in its
// admission, which allocates its devices.
func Unstarted(pod *corev1.Pod) bool {
	return pod.Status.StartTime == nil
}

// PendingUnschedulable reports a pod kube-scheduler tried and could not
// place (gang members are the planner's).
func PendingUnschedulable(p *corev1.Pod) bool {
	if p.Spec.NodeName != "" || Ended(p) || len(p.Spec.SchedulingGates) > 0 || p.Status.Phase != corev1.PodPending && p.Status.Phase != "" {
		return false
	}
	if _, planned := p.Annotations[api.AnnotationGangPlan]; planned {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
			return true
		}
	}
	return false
}

// NotWaiting says why pod is no longer the pod named name (namespace/name)
// with UID uid waiting to be placed, "" when it is: pod is the pod of
// that name now (nil: there is none), and it must have that UID, not have
// ended (Ended) and be bound to no node. What was done for a waiting pod
// (a MIG layout request) is for no one once it says why.
func NotWaiting(name, uid string, pod *corev1.Pod) string {
	switch {
	case pod == nil:
		return fmt.Sprintf("its pod %s is gone", name)
	case string(pod.UID) != uid:
		return fmt.Sprintf("its pod %s (UID %s) is gone; a new pod has the name", name, uid)
	case Ended(pod):
		return fmt.Sprintf("its pod %s is being deleted or has ended", name)
	case pod.Spec.NodeName != "":
		return fmt.Sprintf("its pod %s was placed on node %s", name, pod.Spec.NodeName)
	}
	return ""
}
