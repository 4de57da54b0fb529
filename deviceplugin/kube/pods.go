package kube

import (
	"context"
	"fmt"
	"maps"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/api"
)

// PodWatch follows the pods bound to one node through an informer (a field
// selector on spec.nodeName, so the agent lists and watches only its own
// node's pods). It reports the GPUs that the shared parts of their
// assignments name, and when a pod ends or goes away.
//
// Why: the scheduler extender writes a slice's GPU before it binds the pod,
// and the kubelet admits pods in whatever order it sees them. Until the
// kubelet has admitted the slice, nothing in its allocations says which GPU
// the slice will use, so a whole-GPU pod admitted meanwhile could be given
// that GPU. With the assignment known as soon as the pod is bound, the
// agent withholds the GPU from whole use at once.
type PodWatch struct {
	cs   kubernetes.Interface
	node string
}

// NewPodWatch returns a watch of node's pods.
func NewPodWatch(cs kubernetes.Interface, node string) *PodWatch {
	return &PodWatch{cs: cs, node: node}
}

// Run calls changed after every change to the node's pods, from one
// goroutine, until ctx ends. assigned is a new map each time: the UUIDs
// named by the shared assignments of the pods that have not ended; released
// is set when a pod ended, is being deleted, or went away.
func (w *PodWatch) Run(ctx context.Context, changed func(assigned map[string]bool, released bool)) {
	logger := klog.FromContext(ctx).WithName("pods")
	factory := informers.NewSharedInformerFactoryWithOptions(w.cs, 0, informers.WithTweakListOptions(w.onNode))
	inf := factory.Core().V1().Pods().Informer()
	if err := inf.SetTransform(stripManagedFields); err != nil {
		logger.Error(err, "Keeping pods' managed fields in the cache")
	}
	// The handler's calls are sequential, so this needs no lock.
	assignments := map[string]podAssignment{} // by namespace/name
	report := func(released bool) {
		assigned := map[string]bool{}
		for _, p := range assignments {
			maps.Copy(assigned, p.gpus)
		}
		changed(assigned, released)
	}
	update := func(obj any) {
		pod, ok := obj.(*corev1.Pod)
		if !ok {
			return
		}
		// Only pods that have not ended are kept.
		key := pod.Namespace + "/" + pod.Name
		before, had := assignments[key]
		now := w.assignmentOf(logger, pod, before)
		var gpus map[string]bool
		if now.ended() {
			delete(assignments, key)
		} else {
			assignments[key] = now
			gpus = now.gpus
		}
		released := had && now.ended()
		if released || !maps.Equal(before.gpus, gpus) {
			report(released)
		}
	}
	remove := func(obj any) {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		pod, ok := obj.(*corev1.Pod)
		if !ok {
			return
		}
		delete(assignments, pod.Namespace+"/"+pod.Name)
		report(true)
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    update,
		UpdateFunc: func(_, obj any) { update(obj) },
		DeleteFunc: remove,
	}); err != nil {
		logger.Error(err, "Cannot follow the node's pods")
		return
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	for !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		if ctx.Err() != nil {
			return
		}
	}
	logger.V(2).Info("Following the node's pods", "node", w.node)
	<-ctx.Done()
}

// onNode selects the pods bound to the node.
func (w *PodWatch) onNode(o *metav1.ListOptions) {
	o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", w.node).String()
}

// Assigned lists the node's pods from the API server (a consistent read,
// not the watch's cache) and returns the GPUs named by the shared
// assignments of those that have not ended. Malformed assignments are
// skipped; Run logs them.
func (w *PodWatch) Assigned(ctx context.Context) (map[string]bool, error) {
	opts := metav1.ListOptions{}
	w.onNode(&opts)
	pods, err := w.cs.CoreV1().Pods(metav1.NamespaceAll).List(ctx, opts)
	if err != nil {
		return nil, fmt.Errorf("listing the pods of node %s: %w", w.node, err)
	}
	assigned := map[string]bool{}
	for i := range pods.Items {
		if p := w.assignmentOf(klog.Logger{}, &pods.Items[i], podAssignment{malformed: true}); !p.ended() {
			maps.Copy(assigned, p.gpus)
		}
	}
	return assigned, nil
}

// podAssignment is what the watch keeps of one pod.
type podAssignment struct {
	gpus      map[string]bool // shared GPUs, by UUID
	deleting  bool
	terminal  bool
	malformed bool
}

// ended: the pod no longer runs, or soon will not, so its assignment no
// longer holds a GPU back. While its containers stop, the kubelet's
// allocations still hold what it was admitted with.
func (p podAssignment) ended() bool { return p.terminal || p.deleting }

// assignmentOf reads pod's shared GPUs. A malformed annotation is logged
// when it appears, and the pod's last good reading is kept.
func (w *PodWatch) assignmentOf(logger klog.Logger, pod *corev1.Pod, before podAssignment) podAssignment {
	p := podAssignment{
		deleting: pod.DeletionTimestamp != nil,
		terminal: pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed || pod.Spec.NodeName != w.node,
		gpus:     map[string]bool{},
	}
	a, found, err := api.GetAssignment(pod.Annotations)
	switch {
	case err != nil:
		if !before.malformed {
			logger.Error(err, "Ignoring the pod's malformed assignment; the kubelet's allocations say what it holds once it is admitted", "pod", klog.KObj(pod))
		}
		p.malformed = true
		maps.Copy(p.gpus, before.gpus)
	case found:
		for _, c := range a.Containers {
			if c.Shared != nil {
				p.gpus[c.Shared.GPU.UUID] = true
			}
		}
	}
	return p
}

// stripManagedFields drops what the watch never reads from cached pods.
func stripManagedFields(obj any) (any, error) {
	if acc, ok := obj.(metav1.ObjectMetaAccessor); ok {
		acc.GetObjectMeta().SetManagedFields(nil)
	}
	return obj, nil
}
