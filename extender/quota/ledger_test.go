package quota_test

import (
	"context"
	"fmt"
	"math/rand"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	core "github.com/tessera-gpu/tessera/allocator/quota"
	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/extender/quota"
)

// BenchmarkAdmit: the quota check filter makes per pod, on 1000
// nodes of 8 GPUs with 4000 bound 1-GPU pods in 10 governed namespaces
// (the state is built afresh from the listers on every call).
func BenchmarkAdmit(b *testing.B) {
	quotas := staticQuotas{}
	byNS := map[string][]*corev1.Pod{}
	var nodes []*corev1.Node
	for i := range 1000 {
		n := gpuNode(fmt.Sprintf("node-%04d", i))
		nodes = append(nodes, n)
		for g := range 4 {
			ns := fmt.Sprintf("team-%d", (i*4+g)%10)
			p := gpuPod(fmt.Sprintf("p-%d-%d", i, g), 1, n.Name)
			p.Namespace = ns
			byNS[ns] = append(byNS[ns], p)
		}
	}
	for i := range 10 {
		ns := fmt.Sprintf("team-%d", i)
		quotas[ns] = core.Quota{Namespace: ns, Min: gpus(800), Max: gpus(1600)}
	}
	index := &quota.Index{}
	for _, pods := range byNS {
		for _, p := range pods {
			index.Set(p)
		}
	}
	pod := gpuPod("x", 8, "")
	pod.Namespace = "team-3"
	ctx := context.Background()
	for _, withIndex := range []bool{false, true} {
		l := &quota.Ledger{
			Quotas: quotas,
			Pods:   func(ns string) ([]*corev1.Pod, error) { return byNS[ns], nil },
			Nodes:  func() ([]*corev1.Node, error) { return nodes, nil },
		}
		if withIndex {
			l.Index = index
		}
		e := &quota.Enforcer{Ledger: l}
		b.Run(fmt.Sprintf("index=%v", withIndex), func(b *testing.B) {
			for b.Loop() {
				if v := e.AdmitPod(ctx, pod); !v.Allowed {
					b.Fatal(v.Message)
				}
			}
		})
	}
}

// TestIndexMatchesView: the index's sums equal the full view's for
// random pods (bound, planned, pending with and without a reservation,
// being deleted, finished) and every pod skipped in turn.
func TestIndexMatchesView(t *testing.T) {
	rng := rand.New(rand.NewSource(7))
	quotas := staticQuotas{"a": {Namespace: "a", Min: gpus(4)}, "b": {Namespace: "b", Min: gpus(4)}}
	var pods []*corev1.Pod
	reserved := map[types.UID]bool{}
	plan := map[string]string{}
	if err := api.SetGangPlan(plan, api.GangPlan{Gang: "g", Node: "n0", Expires: time.Unix(1e9, 0)}); err != nil {
		t.Fatal(err)
	}
	for i := range 200 {
		p := gpuPod(fmt.Sprintf("p%d", i), int64(1+rng.Intn(4)), "")
		p.Namespace = []string{"a", "b", "c"}[rng.Intn(3)]
		switch rng.Intn(6) {
		case 0:
			p.Spec.NodeName = "n0"
		case 1:
			p.Annotations[api.AnnotationGangPlan] = plan[api.AnnotationGangPlan]
		case 2:
			reserved[p.UID] = true
		case 3:
			p.Spec.NodeName = "n0"
			now := metav1.Now()
			p.DeletionTimestamp = &now
		case 4:
			p.Spec.NodeName = "n0"
			p.Status.Phase = corev1.PodSucceeded
		}
		if rng.Intn(10) == 0 {
			p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{}
		}
		pods = append(pods, p)
	}
	idx := &quota.Index{}
	for _, p := range pods {
		idx.Set(p)
		idx.Set(p) // updates are idempotent
	}
	// Some go, some change.
	idx.Delete(pods[0].UID)
	pods = pods[1:]
	pods[0] = pods[0].DeepCopy()
	pods[0].Spec.NodeName = "n1"
	idx.Set(pods[0])
	l := &quota.Ledger{
		Quotas: quotas, Index: idx,
		Pods: func(ns string) ([]*corev1.Pod, error) {
			var out []*corev1.Pod
			for _, p := range pods {
				if p.Namespace == ns {
					out = append(out, p)
				}
			}
			return out, nil
		},
		Nodes:    func() ([]*corev1.Node, error) { return nil, nil },
		Reserved: func(uid types.UID) bool { return reserved[uid] },
	}
	for _, skip := range append([]*corev1.Pod{{}}, pods...) {
		v, err := l.View("a", func(p *corev1.Pod) bool { return p.UID == skip.UID })
		if err != nil {
			t.Fatal(err)
		}
		fast, err := l.FastState("a", skip.UID)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(v.State.Used, fast.Used, cmpopts.EquateEmpty()); diff != "" {
			t.Fatalf("skipping %q: used (-view +index):\n%s", skip.Name, diff)
		}
	}
}
