package gpureq

import corev1 "k8s.io/api/core/v1"

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
