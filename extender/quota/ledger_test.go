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

// A pod booked at bind, before the informer shows it, counts in the fast
// state and in the view while the ledger reserves it, and no longer once
// the reservation is dropped; the informer's own event replaces the entry
// (counted once), and booking a pod the index knows changes nothing.
func TestIndexBook(t *testing.T) {
	quotas := staticQuotas{"a": {Namespace: "a", Min: gpus(4)}}
	reserved := map[types.UID]bool{}
	var listed []*corev1.Pod
	idx := &quota.Index{}
	l := &quota.Ledger{Quotas: quotas, Index: idx,
		Pods:     func(string) ([]*corev1.Pod, error) { return listed, nil },
		Nodes:    func() ([]*corev1.Node, error) { return nil, nil },
		Reserved: func(uid types.UID) bool { return reserved[uid] }}
	used := func() (fast, view int64) {
		t.Helper()
		st, err := l.FastState("a", "")
		if err != nil {
			t.Fatal(err)
		}
		v, err := l.View("a", nil)
		if err != nil {
			t.Fatal(err)
		}
		return st.Used["a"][api.ResourceGPU], v.State.Used["a"][api.ResourceGPU]
	}
	p := gpuPod("p", 2, "")
	p.Namespace = "a"
	idx.Book(p)
	if f, v := used(); f != 0 || v != 0 {
		t.Errorf("booked, no reservation: used %d (fast) %d (view), want 0", f, v)
	}
	reserved[p.UID] = true
	if f, v := used(); f != 2 || v != 2 {
		t.Errorf("booked and reserved: used %d (fast) %d (view), want 2", f, v)
	}
	idx.Book(p) // again: no change
	bound := p.DeepCopy()
	bound.Spec.NodeName = "n0"
	idx.Set(bound) // the informer shows it bound
	listed = []*corev1.Pod{bound}
	if f, v := used(); f != 2 || v != 2 {
		t.Errorf("shown bound: used %d (fast) %d (view), want 2", f, v)
	}
	other := gpuPod("q", 1, "")
	other.Namespace = "a"
	idx.Book(other)
	if f, v := used(); f != 2 || v != 2 {
		t.Errorf("booked without a reservation (a bind that failed): used %d (fast) %d (view), want 2", f, v)
	}
}
