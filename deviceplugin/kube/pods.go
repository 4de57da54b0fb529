package kube

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/deviceplugin/devices"
	"github.com/tessera-gpu/tessera/deviceplugin/kubeletstate"
	"github.com/tessera-gpu/tessera/gpureq"
	"github.com/tessera-gpu/tessera/internal/podtrust"
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
	// trust keeps only the assignments Tessera sealed for their pods: a
	// tenant's hand-written one withholds nothing.
	trust *podtrust.Filter

	mu sync.Mutex
	// live are the node's pods (namespace/name) that have not ended, as
	// the watch last saw them.
	live map[string]bool
	// uids are the UIDs of the node's pods by namespace/name, ended or
	// not, as the watch last saw them.
	uids map[string]types.UID
}

// PodUID returns the UID of a pod of the node as the watch last saw it,
// ended or not; "" when it has not seen the pod or saw it go away.
func (w *PodWatch) PodUID(namespace, name string) types.UID {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.uids[namespace+"/"+name]
}

func (w *PodWatch) setUID(key string, uid types.UID) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.uids == nil {
		w.uids = map[string]types.UID{}
	}
	if uid != "" {
		w.uids[key] = uid
	} else {
		delete(w.uids, key)
	}
}

// Live reports whether the watch last saw the pod on the node, not ended.
func (w *PodWatch) Live(namespace, name string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.live[namespace+"/"+name]
}

// LiveList returns the pods the watch last saw on the node, not ended.
func (w *PodWatch) LiveList() []kubeletstate.PodRef {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]kubeletstate.PodRef, 0, len(w.live))
	for key := range w.live {
		ns, name, _ := strings.Cut(key, "/")
		out = append(out, kubeletstate.PodRef{Namespace: ns, Name: name})
	}
	return out
}

func (w *PodWatch) setLive(key string, live bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.live == nil {
		w.live = map[string]bool{}
	}
	if live {
		w.live[key] = true
	} else {
		delete(w.live, key)
	}
}

// NewPodWatch returns a watch of node's pods that reads assignments through
// trust (nil: none is trusted).
func NewPodWatch(cs kubernetes.Interface, node string, trust *podtrust.Filter) *PodWatch {
	return &PodWatch{cs: cs, node: node, trust: trust}
}

// Run calls changed after every change to the node's pods, from one
// goroutine, until ctx ends. assigned is a new map each time: the UUIDs
// named by the shared assignments of the pods that have not ended; released
// is set when a pod ended, is being deleted, or went away.
func (w *PodWatch) Run(ctx context.Context, changed func(assigned map[string]bool, released bool)) {
	logger := klog.FromContext(ctx).WithName("pods")
	factory := informers.NewSharedInformerFactoryWithOptions(w.cs, 0, informers.WithTweakListOptions(w.onNode))
	inf := factory.Core().V1().Pods().Informer()
	if err := inf.SetTransform(w.trust.Transform); err != nil {
		logger.Error(err, "Cannot filter the node's pods; not following them")
		return
	}
	// The handler's calls are sequential, so this needs no lock. By
	// namespace/name, the shared GPUs of each pod that has not ended.
	assignments := map[string]map[string]bool{}
	report := func(released bool) {
		assigned := map[string]bool{}
		for _, gpus := range assignments {
			maps.Copy(assigned, gpus)
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
		w.setUID(key, pod.UID)
		w.setLive(key, !w.ended(pod))
		if w.ended(pod) {
			delete(assignments, key)
			if had {
				report(true)
			}
			return
		}
		now := sharedGPUs(pod)
		if len(now) == 0 && len(before) > 0 {
			// Tessera never takes a shared GPU back from a pod that runs;
			// an assignment gone or no longer Tessera's (the pod's creator
			// edited it: the trust filter dropped it) keeps the last good
			// reading.
			now = before
		}
		assignments[key] = now
		if !maps.Equal(before, now) {
			report(false)
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
		w.setUID(pod.Namespace+"/"+pod.Name, "")
		w.setLive(pod.Namespace+"/"+pod.Name, false)
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
// assignments of those that have not ended (read through the trust
// filter), and among them those of pods the kubelet has not started.
func (w *PodWatch) Assigned(ctx context.Context) (devices.Assignments, error) {
	opts := metav1.ListOptions{}
	w.onNode(&opts)
	pods, err := w.cs.CoreV1().Pods(metav1.NamespaceAll).List(ctx, opts)
	if err != nil {
		return devices.Assignments{}, fmt.Errorf("listing the pods of node %s: %w", w.node, err)
	}
	out := devices.Assignments{GPUs: map[string]bool{}, Unstarted: map[string]bool{}}
	quiet := w.trust.Quiet()
	for i := range pods.Items {
		p := &pods.Items[i]
		if w.ended(p) {
			continue
		}
		quiet.Pod(p)
		gpus := sharedGPUs(p)
		maps.Copy(out.GPUs, gpus)
		if gpureq.Unstarted(p) {
			maps.Copy(out.Unstarted, gpus)
			if s, ok := slicePod(p); ok {
				out.Slices = append(out.Slices, s)
			}
		}
	}
	return out, nil
}

// slicePod describes pod's containers that ask for shared units, with the
// GPUs the shared parts of its assignment name for them (read through the
// trust filter: none when it dropped the assignment); false when none asks.
func slicePod(pod *corev1.Pod) (devices.SlicePod, bool) {
	byName := map[string][]string{}
	if a, found, err := api.GetAssignment(pod.Annotations); err == nil && found {
		for _, c := range a.Containers {
			if c.Shared != nil {
				byName[c.Name] = c.Shared.UUIDs()
			}
		}
	}
	s := devices.SlicePod{Namespace: pod.Namespace, Name: pod.Name, UID: string(pod.UID), Created: pod.CreationTimestamp.Time}
	add := func(c *corev1.Container) {
		units := map[corev1.ResourceName]int64{}
		for _, r := range api.SharedResources() {
			if q, ok := c.Resources.Limits[r]; ok && q.Value() > 0 {
				units[r] = q.Value()
			}
		}
		if len(units) > 0 {
			s.Containers = append(s.Containers, devices.SliceContainer{Name: c.Name, Init: gpureq.KindOf(pod, c.Name) == gpureq.Init, Units: units, GPUs: byName[c.Name]})
		}
	}
	for i := range pod.Spec.InitContainers {
		add(&pod.Spec.InitContainers[i])
	}
	for i := range pod.Spec.Containers {
		add(&pod.Spec.Containers[i])
	}
	return s, len(s.Containers) > 0
}

// ended: the pod no longer runs, or soon will not (or is bound elsewhere):
// gpureq.EndedOn. Its assignment no longer holds a GPU back; while its
// containers stop, the kubelet's allocations still hold what it was
// admitted with.
func (w *PodWatch) ended(pod *corev1.Pod) bool { return gpureq.EndedOn(pod, w.node) }

// sharedGPUs returns the UUIDs of the GPUs the shared parts of pod's
// assignment name (none without one). pod has been through the trust
// filter, which drops a malformed or unsealed assignment.
func sharedGPUs(pod *corev1.Pod) map[string]bool {
	a, found, err := api.GetAssignment(pod.Annotations)
	if err != nil || !found {
		return nil
	}
	gpus := map[string]bool{}
	for _, c := range a.Containers {
		if c.Shared != nil {
			for _, u := range c.Shared.UUIDs() {
				gpus[u] = true
			}
		}
	}
	return gpus
}
