package planner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/internal/nodepin"
	"github.com/tessera-gpu/tessera/internal/podtrust"
)

// GangClient is what the gang planner writes and reads at the API server.
type GangClient interface {
	// SetPlan writes the pod's plan annotation (value "" removes it),
	// provided the pod still has pod's UID.
	SetPlan(ctx context.Context, pod *corev1.Pod, value string) error
	// RemoveGate removes api.SchedulingGateGang from the pod.
	RemoveGate(ctx context.Context, pod *corev1.Pod) error
	// Evict evicts the pod through the Eviction API.
	Evict(ctx context.Context, pod *corev1.Pod) error
	// GetPod reads a pod from the API server, not from a cache, keeping
	// only the decision annotations Tessera sealed for it (as the
	// informer's transform does).
	GetPod(ctx context.Context, namespace, name string) (*corev1.Pod, error)
	// GetPodGroup reads the PodGroup object of a gang declared by one:
	// scheduler-plugins' (scheduling.x-k8s.io/v1alpha1) or Volcano's
	// (scheduling.volcano.sh/v1beta1), by the gang's Source.
	GetPodGroup(ctx context.Context, g *api.Gang) (*unstructured.Unstructured, error)
}

// KubeGang is the GangClient of a real API server. Dynamic may be nil:
// PodGroup-declared gangs then wait (their PodGroup cannot be read).
type KubeGang struct {
	Client  kubernetes.Interface
	Dynamic dynamic.Interface
	// Sealer seals the plans written.
	Sealer *api.Sealer
}

var _ GangClient = (*KubeGang)(nil)

// SetPlan writes (sealed) or removes the plan annotation with a merge
// patch conditional on the UID.
func (k *KubeGang) SetPlan(ctx context.Context, pod *corev1.Pod, value string) error {
	var v, seal any
	if value != "" {
		if k.Sealer == nil {
			return fmt.Errorf("plan of pod %s/%s: no seal key", pod.Namespace, pod.Name)
		}
		v, seal = value, k.Sealer.Seal(pod.UID, api.AnnotationGangPlan, value)
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{
		"uid":         pod.UID,
		"annotations": map[string]any{api.AnnotationGangPlan: v, api.AnnotationGangPlanSeal: seal},
	}})
	if err != nil {
		return fmt.Errorf("plan patch for pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	_, err = k.Client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: FieldManager})
	return err
}

// GetPod implements GangClient: a plan a pod's creator wrote or copied
// (no valid seal) is removed, so it never counts as the planner's.
func (k *KubeGang) GetPod(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
	p, err := k.Client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	(&podtrust.Filter{Sealer: k.Sealer}).Pod(p)
	return p, nil
}

// RemoveGate removes Tessera's gates (gang, queue) with a JSON patch that first tests the
// gate is where pod has it, so a concurrent change fails instead of
// removing another gate. When pod is stale (the informer's copy, say) the
// test fails: the pod is read afresh (through the trust filter) and the
// removal tried once more.
//
// When pod carries its plan, the same patch pins it to the plan's node
// (internal/nodepin): kube-scheduler then evaluates that node alone for
// it, instead of every node, and a sampled percentageOfNodesToScore cannot
// hide the node. The pin narrows nothing the extender's filter did not
// already (a planned pod passes its plan's node only). A patch the API
// server refuses as invalid is tried once more without the pin, so a pin
// never keeps a pod gated.
func (k *KubeGang) RemoveGate(ctx context.Context, pod *corev1.Pod) error {
	err := k.removeGate(ctx, pod, true)
	if err == nil || apierrors.IsNotFound(err) {
		return err
	}
	// A failed test of the patch (a stale copy) is answered 422, as is a
	// refused pin: read the pod afresh first.
	klog.FromContext(ctx).V(2).Info("Lifting the gates from a stale copy failed; reading the pod afresh", "pod", klog.KObj(pod), "err", err, "causes", causes(err))
	fresh, gerr := k.GetPod(ctx, pod.Namespace, pod.Name)
	if gerr != nil {
		return errors.Join(err, gerr)
	}
	if fresh.UID != pod.UID {
		return fmt.Errorf("pod %s/%s was replaced: %w", pod.Namespace, pod.Name, err)
	}
	err = k.removeGate(ctx, fresh, true)
	if !apierrors.IsInvalid(err) {
		return err
	}
	klog.FromContext(ctx).Info("Lifting the gates without pinning the pod to its planned node", "pod", klog.KObj(pod), "err", err, "causes", causes(err))
	return k.removeGate(ctx, fresh, false)
}

// causes are the messages of an API error's causes (a failed patch's
// reason is there, not in its message).
func causes(err error) []string {
	var out []string
	if s, ok := err.(apierrors.APIStatus); ok && s.Status().Details != nil {
		for _, c := range s.Status().Details.Causes {
			out = append(out, c.Message)
		}
	}
	return out
}

func (k *KubeGang) removeGate(ctx context.Context, pod *corev1.Pod, pin bool) error {
	ops := []map[string]any{{"op": "test", "path": "/metadata/uid", "value": pod.UID}}
	// Every Tessera gate (the gang's, the queue's), last first so that the
	// indices of the others hold.
	for j := len(pod.Spec.SchedulingGates) - 1; j >= 0; j-- {
		if name := pod.Spec.SchedulingGates[j].Name; api.IsTesseraGate(name) {
			path := fmt.Sprintf("/spec/schedulingGates/%d", j)
			ops = append(ops, map[string]any{"op": "test", "path": path + "/name", "value": name}, map[string]any{"op": "remove", "path": path})
		}
	}
	if len(ops) == 1 {
		return nil
	}
	if plan, ok, err := api.GetGangPlan(pod.Annotations); pin && ok && err == nil {
		more, err := nodepin.Ops(pod, plan.Node)
		if err != nil {
			klog.FromContext(ctx).V(2).Info("Not pinning the pod to its planned node", "pod", klog.KObj(pod), "err", err)
		}
		ops = append(ops, more...)
	}
	patch, err := json.Marshal(ops)
	if err != nil {
		return fmt.Errorf("gate patch for pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	_, err = k.Client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.JSONPatchType, patch, metav1.PatchOptions{FieldManager: FieldManager})
	return err
}

// apiWriters is how many members' plans (then gates) the planner writes at
// once.
const apiWriters = 16

// withAnnotation returns a copy of pod with annotation key set to value.
func withAnnotation(pod *corev1.Pod, key, value string) *corev1.Pod {
	out := pod.DeepCopy()
	if out.Annotations == nil {
		out.Annotations = map[string]string{}
	}
	out.Annotations[key] = value
	return out
}

// Evict evicts the pod (honouring PodDisruptionBudgets).
func (k *KubeGang) Evict(ctx context.Context, pod *corev1.Pod) error {
	uid := pod.UID
	ev := &policyv1.Eviction{
		ObjectMeta:    metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name},
		DeleteOptions: &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}},
	}
	return k.Client.CoreV1().Pods(pod.Namespace).EvictV1(ctx, ev)
}

// ErrNoPodGroupClient is returned by GetPodGroup without a dynamic client.
var ErrNoPodGroupClient = errors.New("the extender reads no PodGroup objects (no dynamic client)")

// GetPodGroup reads the gang's PodGroup, of the kind its Source names.
func (k *KubeGang) GetPodGroup(ctx context.Context, g *api.Gang) (*unstructured.Unstructured, error) {
	gvr, ok := g.Source.PodGroupGVR()
	if !ok {
		return nil, fmt.Errorf("gang %s is declared by %s, not by a PodGroup", g.Key(), g.Source)
	}
	if k.Dynamic == nil {
		return nil, ErrNoPodGroupClient
	}
	return k.Dynamic.Resource(gvr).Namespace(g.Namespace).Get(ctx, g.Name, metav1.GetOptions{})
}
