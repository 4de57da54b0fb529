package main

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"sync"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/gpureq"
)

// tesseraNodeAgent stands in for what Tessera's node agent does once the
// kubelet admits a whole-GPU pod: it records which GPUs the kubelet gave
// the pod, as the pod's sealed assignment annotation
// (deviceplugin/kube's syncPod). There is no kubelet here. Without the
// record the extender counts every bound whole-GPU pod as pending on its
// node, holds that many fully free GPUs for it, and while any is pending
// puts no slice on a fully free GPU of the node (extender/state.go,
// NodeState.sharedView): right for the seconds a real node agent takes,
// wrong for good. The trace replay runs it for tessera and
// tessera-plugin, like the HAMi stand-in for HAMi (hamiNodeAgent).
//
// The kubelet's pick is stood in for by the lowest-index GPUs of the node
// that hold neither a whole-GPU pod nor a slice.
type tesseraNodeAgent struct {
	*podStandIn[string] // keyed by node name
	client              kubernetes.Interface
	sealer              *api.Sealer
	gpus                func(node string) int
	indexer             cache.Indexer

	mu       sync.Mutex
	recorded map[types.UID][]string // GPUs recorded, before the informer sees them
	records  int
}

const (
	byNode = "node"
	byGPU  = "gpu"
)

// startTesseraNodeAgent starts the stand-in for the pods in ns; gpus gives
// a node's GPU count (its GPUs are gpuUUID(node, 0..n-1)). The seal key is
// the extender's (the Secret it creates before it serves).
func startTesseraNodeAgent(ctx context.Context, client kubernetes.Interface, ns, sealNS string, gpus func(string) int, workers int) (*tesseraNodeAgent, error) {
	secret, err := client.CoreV1().Secrets(sealNS).Get(ctx, api.SealKeySecretName, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("tessera node agent: seal key: %w", err)
	}
	sealer, err := api.NewSealer(secret.Data[api.SealKeyDataKey])
	if err != nil {
		return nil, fmt.Errorf("tessera node agent: %w", err)
	}
	a := &tesseraNodeAgent{
		podStandIn: newPodStandIn[string](client, ns),
		client:     client,
		sealer:     sealer,
		gpus:       gpus,
		recorded:   map[types.UID][]string{},
	}
	inf := a.informer()
	if err := inf.AddIndexers(cache.Indexers{
		byNode: func(obj any) ([]string, error) {
			if p, ok := obj.(*v1.Pod); ok && p.Spec.NodeName != "" {
				return []string{p.Spec.NodeName}, nil
			}
			return nil, nil
		},
		// The GPUs a pod's assignment names (whole or shared), whether or
		// not the pod is bound yet: the extender writes a slice's
		// assignment before its Binding.
		byGPU: func(obj any) ([]string, error) {
			p, ok := obj.(*v1.Pod)
			if !ok {
				return nil, nil
			}
			return assignedGPUs(p), nil
		},
	}); err != nil {
		return nil, fmt.Errorf("tessera node agent indexers: %w", err)
	}
	a.indexer = inf.GetIndexer()
	nodeOf := func(p *v1.Pod) (string, bool) { return p.Spec.NodeName, p.Spec.NodeName != "" && wholeGPUs(p) > 0 }
	if err := a.run(ctx, "tessera node agent", nodeOf, a.sync, workers, 10); err != nil {
		return nil, err
	}
	return a, nil
}

// wholeGPUs is the whole GPUs the pod holds at its peak, as Tessera's
// request model reads it (0 for a pod it refuses).
func wholeGPUs(p *v1.Pod) int {
	d, err := gpureq.ParsePod(p)
	if err != nil {
		return 0
	}
	return int(d.Peak.Whole)
}

// assignedGPUs are the GPU UUIDs of p's assignment annotation (the
// benchmark's pods get theirs only from the extender and this agent).
func assignedGPUs(p *v1.Pod) []string {
	a, ok, err := api.GetAssignment(p.Annotations)
	if !ok || err != nil {
		return nil
	}
	var out []string
	for _, c := range a.Containers {
		for _, g := range c.GPUs {
			out = append(out, g.UUID)
		}
		if c.Shared != nil {
			out = append(out, c.Shared.UUIDs()...)
		}
	}
	return out
}

// sync records GPUs for the node's bound whole-GPU pods that have none
// yet. The queue never hands one node to two workers at once.
func (a *tesseraNodeAgent) sync(ctx context.Context, node string) error {
	objs, err := a.indexer.ByIndex(byNode, node)
	if err != nil {
		return err
	}
	n := a.gpus(node)
	used := make([]bool, n)
	a.mu.Lock()
	for i := range used {
		uuid := gpuUUID(node, i)
		holders, _ := a.indexer.ByIndex(byGPU, uuid)
		used[i] = len(holders) > 0
		for _, uuids := range a.recorded {
			for _, u := range uuids {
				used[i] = used[i] || u == uuid
			}
		}
	}
	a.mu.Unlock()
	var todo []*v1.Pod
	for _, o := range objs {
		p := o.(*v1.Pod)
		a.mu.Lock()
		_, done := a.recorded[p.UID]
		a.mu.Unlock()
		if wholeGPUs(p) > 0 && len(assignedGPUs(p)) == 0 && !done && p.DeletionTimestamp == nil {
			todo = append(todo, p)
		}
	}
	sort.Slice(todo, func(i, j int) bool { return todo[i].Name < todo[j].Name })
	for _, p := range todo {
		want := wholeGPUs(p)
		var refs []api.GPURef
		for i := 0; i < n && len(refs) < want; i++ {
			if !used[i] {
				refs = append(refs, api.GPURef{UUID: gpuUUID(node, i), Index: i})
			}
		}
		if len(refs) < want {
			return fmt.Errorf("node %s: %d free GPUs for pod %s, which has %d", node, len(refs), p.Name, want)
		}
		asg := api.NewAssignment()
		asg.Containers = []api.ContainerAssignment{{Name: p.Spec.Containers[0].Name, GPUs: refs}}
		ann, err := a.sealer.AssignmentAnnotations(p.UID, asg)
		if err != nil {
			return fmt.Errorf("pod %s: %w", p.Name, err)
		}
		patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"resourceVersion": p.ResourceVersion, "annotations": ann}})
		if err != nil {
			return err
		}
		if _, err := a.client.CoreV1().Pods(p.Namespace).Patch(ctx, p.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			if apierrors.IsNotFound(err) {
				continue
			}
			return fmt.Errorf("record the GPUs of pod %s: %w", p.Name, err)
		}
		uuids := make([]string, len(refs))
		for i, r := range refs {
			uuids[i] = r.UUID
			used[r.Index] = true
		}
		a.mu.Lock()
		a.recorded[p.UID] = uuids
		a.records++
		a.mu.Unlock()
	}
	return nil
}

func (a *tesseraNodeAgent) stop() {
	if a != nil {
		a.podStandIn.stop()
	}
}

func (a *tesseraNodeAgent) counts() (records, failures int, lastErr error) {
	failures, lastErr = a.failed()
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.records, failures, lastErr
}
