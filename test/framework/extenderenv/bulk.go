package extenderenv

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// FastClient is an admin client without client-side rate limits worth
// mentioning (QPS and burst 5000), for creating many objects.
func (e *Env) FastClient(t testing.TB) kubernetes.Interface {
	t.Helper()
	rc := e.CP.RESTConfig()
	rc.QPS, rc.Burst = 5000, 5000
	c, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// parallel runs f on every item with workers goroutines; the first error
// stops the feeding and fails t (after the running calls return).
func parallel[T any](t testing.TB, items []T, workers int, f func(context.Context, T) error) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	work := make(chan T)
	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
	)
	for range max(workers, 1) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for it := range work {
				if err := f(ctx, it); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					cancel()
				}
			}
		}()
	}
feed:
	for _, it := range items {
		select {
		case work <- it:
		case <-ctx.Done():
			break feed
		}
	}
	close(work)
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d items: %v (and %d more errors)", len(items), errs[0], len(errs)-1)
	}
}

// CreatePods creates the pods of specs (see CreatePod) with workers in
// parallel, through FastClient.
func (e *Env) CreatePods(t testing.TB, specs []PodSpec, workers int) {
	t.Helper()
	client := e.FastClient(t)
	parallel(t, specs, workers, func(ctx context.Context, s PodSpec) error {
		_, err := createPod(ctx, client, e.Sealer, s)
		return err
	})
}

// CreateNodes creates the Nodes of specs with workers in parallel, two
// API calls each: the Node created with its Ready status and capacities
// (the API server keeps a new Node's status, as kubelet registration
// relies on), then the node.kubernetes.io/not-ready taint that admission
// adds taken off, as the node lifecycle controller would. For hundreds of
// nodes; CreateNode is the one-node form.
func (e *Env) CreateNodes(t testing.TB, specs []NodeSpec, workers int) {
	t.Helper()
	client := e.FastClient(t)
	parallel(t, specs, workers, func(ctx context.Context, s NodeSpec) error { return createFakeNode(ctx, client, s) })
}

func createFakeNode(ctx context.Context, client kubernetes.Interface, s NodeSpec) error {
	o, err := NodeOptions(s)
	if err != nil {
		return err
	}
	now := metav1.Now()
	cond := func(ty v1.NodeConditionType, st v1.ConditionStatus, reason string) v1.NodeCondition {
		return v1.NodeCondition{Type: ty, Status: st, Reason: reason, LastHeartbeatTime: now, LastTransitionTime: now}
	}
	labels := map[string]string{v1.LabelHostname: s.Name}
	for k, v := range o.Labels {
		labels[k] = v
	}
	n := &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: s.Name, Labels: labels, Annotations: o.Annotations},
		Status: v1.NodeStatus{
			Capacity:    o.Capacity,
			Allocatable: o.Capacity.DeepCopy(),
			Conditions: []v1.NodeCondition{
				cond(v1.NodeReady, v1.ConditionTrue, "KubeletReady"),
				cond(v1.NodeMemoryPressure, v1.ConditionFalse, "KubeletHasSufficientMemory"),
				cond(v1.NodeDiskPressure, v1.ConditionFalse, "KubeletHasNoDiskPressure"),
				cond(v1.NodePIDPressure, v1.ConditionFalse, "KubeletHasSufficientPID"),
			},
			Addresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "127.0.0.1"}, {Type: v1.NodeHostName, Address: s.Name}},
		},
	}
	out, err := client.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create node %s: %w", s.Name, err)
	}
	if len(out.Spec.Taints) == 0 {
		return nil
	}
	keep := []v1.Taint{}
	for _, tt := range out.Spec.Taints {
		if tt.Key != v1.TaintNodeNotReady && tt.Key != v1.TaintNodeUnreachable {
			keep = append(keep, tt)
		}
	}
	taints, err := json.Marshal(keep)
	if err != nil {
		return err
	}
	patch := fmt.Appendf(nil, `[{"op":"test","path":"/metadata/resourceVersion","value":%q},{"op":"replace","path":"/spec/taints","value":%s}]`,
		out.ResourceVersion, taints)
	if _, err := client.CoreV1().Nodes().Patch(ctx, s.Name, types.JSONPatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("remove not-ready taint from %s: %w", s.Name, err)
	}
	return nil
}
