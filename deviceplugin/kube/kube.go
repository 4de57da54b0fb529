// Package kube is the node agent's writer to the Kubernetes API: the GPU
// inventory annotation and the shared-isolation condition of its Node, and
// the whole-GPU part of each GPU pod's assignment annotation. It also reads
// back the shared part the scheduler extender wrote, so the agent knows
// which GPU a shared container is served from.
package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/deviceplugin/kubeletstate"
	"github.com/tessera-gpu/tessera/gpureq"
	"github.com/tessera-gpu/tessera/internal/podtrust"
)

// podRecheck is how long a pod whose allocations have not changed is left
// alone before its annotation is read again.
const podRecheck = 5 * time.Minute

// Client writes the node agent's state to the API server.
type Client struct {
	cs   kubernetes.Interface
	node string
	now  func() time.Time
	// trust keeps only the assignments Tessera sealed (its Sealer seals
	// what the client writes).
	trust *podtrust.Filter

	// writeMu orders the client's writes to its Node: CheckNode writes
	// again what publishAnnotation and SetSharedIsolation last wrote, never
	// an older value over a newer one.
	writeMu   sync.Mutex
	mu        sync.Mutex
	published map[string]string // last published value per annotation
	condition *sharedIsolation  // last published SharedIsolation
	pods      map[podKey]podRecord
}

// sharedIsolation is the SharedIsolation condition the client last set.
type sharedIsolation struct {
	connected bool
	message   string
}

type podKey struct{ namespace, name string }

type podRecord struct {
	fingerprint string
	checked     time.Time
	shared      map[string]string // container -> GPU UUID
}

// New returns a client for node that reads and seals assignments with
// trust; now is the clock (time.Now when nil).
func New(cs kubernetes.Interface, node string, trust *podtrust.Filter, now func() time.Time) *Client {
	if now == nil {
		now = time.Now
	}
	return &Client{cs: cs, node: node, now: now, trust: trust, pods: map[podKey]podRecord{}, published: map[string]string{}}
}

// PublishInventory writes inv as the Node's inventory annotation, unless
// the last published value is the same.
func (c *Client) PublishInventory(ctx context.Context, inv *api.GPUInventory) error {
	value, err := api.EncodeGPUInventory(inv)
	if err != nil {
		return err
	}
	return c.publishAnnotation(ctx, api.AnnotationGPUInventory, value, "the GPU inventory")
}

// PublishNUMATopology writes t as the Node's NUMA annotation
// (api.AnnotationNUMATopology), unless the last published value is the
// same.
func (c *Client) PublishNUMATopology(ctx context.Context, t *api.NUMATopology) error {
	value, err := api.EncodeNUMATopology(t)
	if err != nil {
		return err
	}
	return c.publishAnnotation(ctx, api.AnnotationNUMATopology, value, "the NUMA topology")
}

// publishAnnotation patches the Node's annotation key to value unless this
// client last published the same value there.
func (c *Client) publishAnnotation(ctx context.Context, key, value, what string) error {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	c.mu.Lock()
	same := c.published[key] == value
	c.mu.Unlock()
	if same {
		return nil
	}
	if err := c.patchAnnotations(ctx, map[string]string{key: value}); err != nil {
		return fmt.Errorf("publishing %s on node %s: %w", what, c.node, err)
	}
	c.mu.Lock()
	c.published[key] = value
	c.mu.Unlock()
	klog.FromContext(ctx).V(2).Info("Published "+what, "node", klog.KRef("", c.node), "bytes", len(value))
	return nil
}

// SetSharedIsolation sets the Node's api.ConditionSharedGPUIsolation
// condition, unless it was already set to the same status by this client.
func (c *Client) SetSharedIsolation(ctx context.Context, connected bool, message string) error {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	c.mu.Lock()
	same := c.condition != nil && c.condition.connected == connected
	c.mu.Unlock()
	if same {
		return nil
	}
	if err := c.patchSharedIsolation(ctx, connected, message); err != nil {
		return err
	}
	c.mu.Lock()
	c.condition = &sharedIsolation{connected: connected, message: message}
	c.mu.Unlock()
	return nil
}

// patchAnnotations merges annotations into the Node's.
func (c *Client) patchAnnotations(ctx context.Context, annotations map[string]string) error {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": annotations}})
	if err != nil {
		return err
	}
	_, err = c.cs.CoreV1().Nodes().Patch(ctx, c.node, types.MergePatchType, patch, metav1.PatchOptions{})
	return err
}

// patchSharedIsolation sets the Node's SharedIsolation condition.
func (c *Client) patchSharedIsolation(ctx context.Context, connected bool, message string) error {
	status, reason := corev1.ConditionFalse, api.ReasonNRINotConnected
	if connected {
		status, reason = corev1.ConditionTrue, api.ReasonNRIConnected
	}
	now := metav1.NewTime(c.now())
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": []corev1.NodeCondition{{
		Type:               api.ConditionSharedGPUIsolation,
		Status:             status,
		Reason:             reason,
		Message:            message,
		LastHeartbeatTime:  now,
		LastTransitionTime: now,
	}}}})
	if err != nil {
		return err
	}
	if _, err := c.cs.CoreV1().Nodes().Patch(ctx, c.node, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
		return fmt.Errorf("setting condition %s on node %s: %w", api.ConditionSharedGPUIsolation, c.node, err)
	}
	return nil
}

// MIGDevice is what SyncPods records of a MIG instance of the node: its
// reference (UUID, profile, GPU) and its placement start, by which a
// container's instances are ordered within a GPU.
type MIGDevice struct {
	api.MIGRef
	Start int
}

// SyncPods records, for every pod in allocs (allocations from the
// PodResources API), the whole GPUs and the MIG instances each container
// holds in the pod's assignment annotation, keeping the shared parts the
// extender wrote; and it returns the GPU(s) the extender assigned to each
// container that holds shared units, as the slice's MPS group key
// (gpureq.GroupKey: a UUID, or a multi-GPU slice's UUIDs joined by ","). gpuIndex maps GPU UUIDs to NVML
// indices, migs MIG UUIDs to their instances. A malformed annotation is
// left as it is and reported. Pods no longer in allocs are forgotten.
func (c *Client) SyncPods(ctx context.Context, allocs []kubeletstate.ContainerDevices, gpuIndex map[string]int, migs map[string]MIGDevice) (map[kubeletstate.ContainerKey]string, error) {
	logger := klog.FromContext(ctx)
	type podAllocs struct {
		whole  map[string][]api.GPURef // container -> GPUs
		mig    map[string][]MIGDevice  // container -> MIG instances
		shared map[string]bool         // containers with shared units
		// unknown are the MIG instances a container holds that the node
		// does not have (or not of the resource's profile).
		unknown map[string][]string
	}
	pods := map[podKey]*podAllocs{}
	for _, a := range allocs {
		if a.Namespace == "" || a.Name == "" {
			continue
		}
		k := podKey{a.Namespace, a.Name}
		p := pods[k]
		if p == nil {
			p = &podAllocs{whole: map[string][]api.GPURef{}, mig: map[string][]MIGDevice{}, shared: map[string]bool{}, unknown: map[string][]string{}}
			pods[k] = p
		}
		if profile, ok := api.MIGProfileOf(a.Resource); ok {
			for _, id := range a.DeviceIDs {
				m, ok := migs[id]
				if !ok || m.Profile != profile {
					// The node's layout changed under the pod (an instance
					// destroyed out of band, a GPU reset): what was recorded
					// of it stays (syncPod), so its GPU keeps its tenant.
					p.unknown[a.Container] = append(p.unknown[a.Container], id)
					continue
				}
				p.mig[a.Container] = append(p.mig[a.Container], m)
			}
			continue
		}
		if a.Resource != api.ResourceGPU {
			p.shared[a.Container] = true
			continue
		}
		for _, id := range a.DeviceIDs {
			idx, ok := gpuIndex[id]
			if !ok {
				logger.Info("Pod holds a GPU this node does not have; not recording it", "pod", klog.KRef(a.Namespace, a.Name), "container", a.Container, "device", id)
				continue
			}
			p.whole[a.Container] = append(p.whole[a.Container], api.GPURef{UUID: id, Index: idx})
		}
	}

	out := map[kubeletstate.ContainerKey]string{}
	var errs []error
	now := c.now()
	c.mu.Lock()
	for k := range c.pods {
		if pods[k] == nil {
			delete(c.pods, k)
		}
	}
	c.mu.Unlock()
	for k, p := range pods {
		for _, refs := range p.whole {
			sort.Slice(refs, func(i, j int) bool { return refs[i].Index < refs[j].Index })
		}
		mig := map[string][]api.MIGRef{}
		for container, ms := range p.mig {
			sort.Slice(ms, func(i, j int) bool {
				if ms[i].GPU.Index != ms[j].GPU.Index {
					return ms[i].GPU.Index < ms[j].GPU.Index
				}
				return ms[i].Start < ms[j].Start
			})
			for _, m := range ms {
				mig[container] = append(mig[container], m.MIGRef)
			}
		}
		fp, _ := json.Marshal([]any{p.whole, mig, p.shared, p.unknown})
		c.mu.Lock()
		rec, ok := c.pods[k]
		c.mu.Unlock()
		if !ok || rec.fingerprint != string(fp) || now.Sub(rec.checked) >= podRecheck {
			shared, err := c.syncPod(ctx, k, p.whole, mig, p.shared, p.unknown)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			rec = podRecord{fingerprint: string(fp), checked: now, shared: shared}
			c.mu.Lock()
			c.pods[k] = rec
			c.mu.Unlock()
		}
		for container, uuid := range rec.shared {
			out[kubeletstate.ContainerKey{Namespace: k.namespace, Name: k.name, Container: container}] = uuid
		}
	}
	if len(errs) > 0 {
		return out, fmt.Errorf("recording GPU assignments: %w", errors.Join(errs...))
	}
	return out, nil
}

// syncPod merges whole and mig into the pod's assignment annotation and
// returns the shared GPUs of the containers in shared. unknown are the MIG
// instances a container holds that the node does not have: a recorded
// instance among them is kept as recorded (fail closed: its GPU keeps its
// tenant), one never recorded cannot be (its GPU is not known); both are
// logged as errors.
func (c *Client) syncPod(ctx context.Context, k podKey, whole map[string][]api.GPURef, mig map[string][]api.MIGRef, shared map[string]bool, unknown map[string][]string) (map[string]string, error) {
	logger := klog.FromContext(ctx)
	pod, err := c.cs.CoreV1().Pods(k.namespace).Get(ctx, k.name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading pod %s/%s: %w", k.namespace, k.name, err)
	}
	if pod.Spec.NodeName != "" && pod.Spec.NodeName != c.node {
		return nil, fmt.Errorf("pod %s/%s runs on node %s, not %s; not recording its GPUs", k.namespace, k.name, pod.Spec.NodeName, c.node)
	}
	// What is not Tessera's sealed decision for this pod is not kept: the
	// whole GPUs are recorded over it.
	c.trust.Quiet().Pod(pod)
	a, found, err := api.GetAssignment(pod.Annotations)
	if err != nil {
		// Lose nothing: a malformed value stays for whoever wrote it to fix.
		logger.Error(err, "Not recording whole GPUs over a malformed assignment annotation", "pod", klog.KObj(pod))
		return nil, nil
	}
	if !found {
		a = api.NewAssignment()
	}
	sharedGPUs := map[string]string{}
	for container := range shared {
		if ca := a.Container(container); ca != nil && ca.Shared != nil {
			sharedGPUs[container] = gpureq.GroupKey(ca.Shared.UUIDs())
		}
	}
	// The kubelet's record is the truth for whole GPUs and MIG instances:
	// set them where held, clear them where not.
	for i := range a.Containers {
		name := a.Containers[i].Name
		recorded := a.Containers[i].MIG
		a.Containers[i].GPUs = whole[name]
		a.Containers[i].MIG = mig[name]
		for _, id := range unknown[name] {
			if at := slices.IndexFunc(recorded, func(r api.MIGRef) bool { return r.UUID == id }); at >= 0 {
				a.Containers[i].MIG = append(a.Containers[i].MIG, recorded[at])
				logger.Error(nil, "Pod holds a MIG instance this node does not have (its layout changed under the pod); keeping it recorded, so its GPU keeps a tenant and is not repartitioned", "pod", klog.KObj(pod), "container", name, "device", id, "gpu", recorded[at].GPU.Index)
			}
		}
	}
	for name, ids := range unknown {
		for _, id := range ids {
			if ca := a.Container(name); ca == nil || !slices.ContainsFunc(ca.MIG, func(r api.MIGRef) bool { return r.UUID == id }) {
				logger.Error(nil, "Pod holds a MIG instance this node does not have and that was never recorded; it cannot be recorded (its GPU is not known)", "pod", klog.KObj(pod), "container", name, "device", id)
			}
		}
	}
	for name, refs := range whole {
		if a.Container(name) == nil {
			a.Containers = append(a.Containers, api.ContainerAssignment{Name: name, GPUs: refs})
		}
	}
	for name, refs := range mig {
		if ca := a.Container(name); ca == nil {
			a.Containers = append(a.Containers, api.ContainerAssignment{Name: name, MIG: refs})
		}
	}
	kept := a.Containers[:0]
	for _, ca := range a.Containers {
		if len(ca.GPUs) > 0 || len(ca.MIG) > 0 || ca.Shared != nil {
			kept = append(kept, ca)
		}
	}
	a.Containers = kept
	sort.Slice(a.Containers, func(i, j int) bool { return a.Containers[i].Name < a.Containers[j].Name })
	if !found && len(a.Containers) == 0 {
		return sharedGPUs, nil
	}
	value, err := api.EncodeAssignment(a)
	if err != nil {
		return nil, fmt.Errorf("pod %s/%s: %w", k.namespace, k.name, err)
	}
	if found && pod.Annotations[api.AnnotationAssignment] == value {
		return sharedGPUs, nil
	}
	annotations, err := c.trust.Sealed(pod.UID, api.AnnotationAssignment, value)
	if err != nil {
		return nil, fmt.Errorf("recording the GPUs of pod %s/%s: %w", k.namespace, k.name, err)
	}
	// The resourceVersion makes the patch fail rather than overwrite a
	// concurrent change (the extender's); the next sync retries.
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{
		"resourceVersion": pod.ResourceVersion,
		"annotations":     annotations,
	}})
	if err != nil {
		return nil, err
	}
	if _, err := c.cs.CoreV1().Pods(k.namespace).Patch(ctx, k.name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return nil, fmt.Errorf("recording GPUs of pod %s/%s: %w", k.namespace, k.name, err)
	}
	logger.V(2).Info("Recorded the pod's whole GPUs and MIG instances", "pod", klog.KObj(pod), "assignment", value)
	return sharedGPUs, nil
}
