package extender

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	corev1listers "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/extender/planner"
	"github.com/tessera-gpu/tessera/internal/podtrust"
)

// FieldManager is the field manager of the extender's API writes (the
// planner's too).
const FieldManager = planner.FieldManager

// KubePods is the PodClient of a real API server.
type KubePods struct {
	Client kubernetes.Interface
	// Lister, when set, serves GetPod from the informer's cache, sparing
	// an API request per bind; a pod it does not have is read from the API
	// server. A stale copy is harmless: the Binding is conditional
	// on the UID (and the resourceVersion when it carries an assignment),
	// and one that fails is checked against a fresh read (see
	// Server.Bind).
	Lister corev1listers.PodLister
	// Trust sanitizes the pods read from the API server, and its Sealer
	// seals the assignments written.
	Trust *podtrust.Filter
}

var _ PodClient = (*KubePods)(nil)

// GetPod reads a pod: from the lister, whose informer's transform must be
// Trust's, or else from the API server.
func (k *KubePods) GetPod(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
	if k.Lister != nil {
		if p, err := k.Lister.Pods(namespace).Get(name); err == nil {
			return p.DeepCopy(), nil
		}
	}
	return k.GetFreshPod(ctx, namespace, name)
}

// GetFreshPod reads a pod from the API server, through Trust.
func (k *KubePods) GetFreshPod(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
	p, err := k.Client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	k.Trust.Pod(p)
	return p, nil
}

// Bind creates the pod's Binding to node, conditional on the pod's UID.
// A non-empty assignment goes in the Binding's annotations with its seal:
// the API server copies them onto the pod in the same update that binds
// it, so the node never sees the pod bound without its assignment, nor an
// unbound pod keep one. The Binding is then conditional on the pod's
// resourceVersion too: a pod that changed since it was read (bound
// meanwhile, say) is a Conflict.
func (k *KubePods) Bind(ctx context.Context, pod *corev1.Pod, node, assignment string) error {
	b := &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID},
		Target:     corev1.ObjectReference{Kind: "Node", Name: node},
	}
	if assignment != "" {
		annotations, err := k.Trust.Sealed(pod.UID, api.AnnotationAssignment, assignment)
		if err != nil {
			return fmt.Errorf("assignment of pod %s/%s: %w", pod.Namespace, pod.Name, err)
		}
		b.Annotations = annotations
		b.ResourceVersion = pod.ResourceVersion
	}
	return k.Client.CoreV1().Pods(pod.Namespace).Bind(ctx, b, metav1.CreateOptions{FieldManager: FieldManager})
}

// Informers are the informers the cache is fed from.
type Informers interface {
	AddEventHandler(handler toolscache.ResourceEventHandler) (toolscache.ResourceEventHandlerRegistration, error)
}

// Watch feeds c from node and pod informers. Malformed assignments are
// reported as Events on their pods (events may be nil).
func Watch(ctx context.Context, c *Cache, nodes, pods Informers, events EventRecorder) error {
	logger := klog.FromContext(ctx)
	if _, err := nodes.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if n, ok := obj.(*corev1.Node); ok {
				c.SetNode(n)
				logNodeErr(logger, c, n.Name)
			}
		},
		UpdateFunc: func(oldObj, newObj any) {
			if n, ok := newObj.(*corev1.Node); ok {
				c.SetNode(n)
				if o, ok := oldObj.(*corev1.Node); !ok || o.Annotations[api.AnnotationGPUInventory] != n.Annotations[api.AnnotationGPUInventory] {
					logNodeErr(logger, c, n.Name)
				}
			}
		},
		DeleteFunc: func(obj any) {
			if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if n, ok := obj.(*corev1.Node); ok {
				c.DeleteNode(n.Name)
			}
		},
	}); err != nil {
		return fmt.Errorf("node informer: %w", err)
	}
	report := func(pod *corev1.Pod, u *PodUse) {
		if u == nil || u.Err == nil {
			return
		}
		logger.Info("Pod's GPU use cannot be read", "pod", klog.KObj(pod), "err", u.Err)
		if events != nil {
			events.Eventf(pod, corev1.EventTypeWarning, "MalformedGPUAssignment", "tessera-extender: %v", u.Err)
		}
	}
	if _, err := pods.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if p, ok := obj.(*corev1.Pod); ok {
				report(p, c.SetPod(p))
			}
		},
		UpdateFunc: func(oldObj, newObj any) {
			p, ok := newObj.(*corev1.Pod)
			if !ok {
				return
			}
			u := c.SetPod(p)
			if o, ok := oldObj.(*corev1.Pod); ok && o.Annotations[api.AnnotationAssignment] == p.Annotations[api.AnnotationAssignment] && o.Spec.NodeName == p.Spec.NodeName {
				return // already reported
			}
			report(p, u)
		},
		DeleteFunc: func(obj any) {
			if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if p, ok := obj.(*corev1.Pod); ok {
				c.DeletePod(p.UID)
			}
		},
	}); err != nil {
		return fmt.Errorf("pod informer: %w", err)
	}
	return nil
}

func logNodeErr(logger klog.Logger, c *Cache, name string) {
	if st, ok := c.Node(name); ok && st.Info.Err != nil {
		logger.Info("Node's GPU inventory is malformed; it fits no GPU pod", "node", klog.KRef("", name), "err", st.Info.Err)
	}
}

// Evicter evicts pods through the Eviction API, which honours
// PodDisruptionBudgets: a budget that forbids the eviction answers 429
// (apierrors.IsTooManyRequests).
type Evicter interface {
	// Evict evicts the pod; with dryRun the API server only checks that
	// it may (budgets included).
	Evict(ctx context.Context, pod *corev1.Pod, dryRun bool) error
}

// KubeEvicter is the Evicter of a real API server.
type KubeEvicter struct {
	Client kubernetes.Interface
	// REST, when set (the core/v1 REST client of Client), makes evictions
	// without client-side retries: a budget still being processed answers
	// 429 with Retry-After 10, which client-go would retry ten times
	// (100 s) while reclaim should pass the workload over at once. A fake
	// clientset has no REST client: then Client's EvictV1 is used.
	REST rest.Interface
}

var _ Evicter = (*KubeEvicter)(nil)

var _ interface {
	DeletePastBudget(context.Context, *corev1.Pod) error
} = (*KubeEvicter)(nil)

// DeletePastBudget deletes the pod, conditional on its UID, whatever its
// PodDisruptionBudget says (kube-scheduler's preemption deletes its victims
// the same way): reclaim's last resort when every choice needs a workload
// whose budget refuses eviction. The pod keeps its grace period.
func (k *KubeEvicter) DeletePastBudget(ctx context.Context, pod *corev1.Pod) error {
	uid := pod.UID
	return k.Client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
}

// Evict creates an Eviction conditional on the pod's UID.
func (k *KubeEvicter) Evict(ctx context.Context, pod *corev1.Pod, dryRun bool) error {
	uid := pod.UID
	opts := &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	ev := &policyv1.Eviction{
		TypeMeta:   metav1.TypeMeta{APIVersion: policyv1.SchemeGroupVersion.String(), Kind: "Eviction"},
		ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name}, DeleteOptions: opts,
	}
	if k.REST != nil {
		return k.REST.Post().Namespace(pod.Namespace).Resource("pods").Name(pod.Name).SubResource("eviction").
			MaxRetries(0).Body(ev).Do(ctx).Error()
	}
	return k.Client.CoreV1().Pods(pod.Namespace).EvictV1(ctx, ev)
}
