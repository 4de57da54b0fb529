package consistency_test

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/extender"
	"github.com/tessera-gpu/tessera/gpureq"
	"github.com/tessera-gpu/tessera/nri"
)

// The MPS group rule (gpureq.Groups) as the extender and the NRI plugin
// apply it on one node, pod after pod: a multi-GPU slice goes on GPUs
// that serve no slice or that form exactly its set; a slice of one GPU
// never joins a set's daemon. Both components give the same answer for
// every step, and the NRI ledger asks the MPS controller for one daemon
// per group, never two over a GPU.
func TestMultiGPUGroupRule(t *testing.T) {
	f := newFixture(t)
	var uses []*extender.PodUse
	var ledger []nri.Entry
	newPod := func(name, count, m, c string) *corev1.Pod {
		r := row{count: count, ctrs: []ctr{{name: "main", mem: m, cores: c}}}
		p := r.pod()
		p.Name, p.UID = name, types.UID("uid-"+name)
		return p
	}
	// place runs the pod through the extender's filter and bind on the
	// node as it is, and, when it fits, through the NRI decision with the
	// assignment; it returns the slice's GPU indices (nil: refused by
	// both) and fails when the two disagree.
	place := func(pod *corev1.Pod) []int {
		t.Helper()
		d, err := extender.ParseDemand(pod)
		if err != nil {
			t.Fatalf("%s: %v", pod.Name, err)
		}
		st := extender.BuildNodeState(f.info, uses)
		v := extender.Filter(st, &d)
		local := f.nriDecide(t, pod, nil, ledger) // the same pod placed by the node (bypassing the extender)
		if !v.Fits() {
			if local.err == nil {
				t.Fatalf("%s: the extender refuses (%s) and the NRI plugin places it locally on %v", pod.Name, v.Message, local.indices)
			}
			return nil
		}
		if local.err != nil {
			t.Fatalf("%s: the extender places it and the NRI plugin, placing it locally, refuses: %v", pod.Name, local.err)
		}
		use, err := extender.ChoosePlacement(f.policy, st, pod.UID, &d)
		if err != nil {
			t.Fatalf("%s: ChoosePlacement after Filter fit: %v", pod.Name, err)
		}
		a := extender.SharedAssignment(nil, use)
		got := f.nriDecide(t, pod, a, ledger)
		if got.err != nil {
			t.Fatalf("%s: the NRI plugin refuses the extender's assignment %+v: %v", pod.Name, a.Containers[0].Shared, got.err)
		}
		bound := pod.DeepCopy()
		bound.Spec.NodeName = "n"
		bound.Annotations = map[string]string{}
		if err := api.SetAssignment(bound.Annotations, a); err != nil {
			t.Fatal(err)
		}
		uses = append(uses, extender.NewPodUse(bound))
		ledger = append(ledger, got.entry)
		return got.indices
	}

	// A multi-GPU slice of two GPUs opens a set on two free GPUs.
	if got := place(newPod("a", "2", "16", "40")); !slices.Equal(got, []int{0, 1}) {
		t.Fatalf("a: GPUs %v, want [0 1]", got)
	}
	// A slice of one GPU does not join the set, though GPUs 0 and 1 are
	// the fullest (the binpack policy would pick them).
	b := place(newPod("b", "", "4", "10"))
	if len(b) != 1 || b[0] < 2 {
		t.Fatalf("b: GPUs %v, want one GPU outside the set [0 1]", b)
	}
	// Another slice of the same GPU count joins the set: the fuller set
	// first, no new daemon.
	if got := place(newPod("c", "2", "8", "20")); !slices.Equal(got, []int{0, 1}) {
		t.Fatalf("c: GPUs %v, want the set [0 1]", got)
	}
	// Three GPUs: GPUs 0 and 1 are a set of two and GPU b's serves a
	// slice of its own; only one GPU is free. Both refuse.
	if got := place(newPod("d", "3", "3", "30")); got != nil {
		t.Fatalf("d: GPUs %v, want refused", got)
	}
	// Four GPUs: refused by both.
	if got := place(newPod("e", "4", "4", "4")); got != nil {
		t.Fatalf("e: GPUs %v, want refused", got)
	}

	// An assignment that puts a slice of one GPU under the set's daemon
	// (what a forged or stale record would ask): the NRI plugin refuses
	// it with the group rule's code, and the extender's bind does not
	// reuse it.
	single := newPod("f", "", "1", "1")
	forged := api.NewAssignment()
	forged.Containers = []api.ContainerAssignment{{Name: "main", Shared: &api.SharedGPU{GPU: api.GPURef{UUID: f.uuids[0], Index: 0}, MemoryMiB: unitMiB, Cores: 1}}}
	if got := f.nriDecide(t, single, forged, ledger); codeOf(t, "nri.Decide", got.err) != gpureq.CodeMPSGroup {
		t.Errorf("f on GPU 0 of the set: NRI %v, want %s", got.err, gpureq.CodeMPSGroup)
	}
	d, err := extender.ParseDemand(single)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := extender.ReuseShared(extender.BuildNodeState(f.info, uses), single.UID, &d, forged); ok {
		t.Errorf("f: the extender's bind reuses an assignment under the set's daemon")
	}
	// A set over GPU 1 and the free GPU: refused by the NRI plugin too.
	pair := newPod("g", "2", "2", "2")
	free := 5 - b[0] // the GPU of 2 and 3 that b left free
	over := api.NewAssignment()
	over.Containers = []api.ContainerAssignment{{Name: "main", Shared: &api.SharedGPU{GPU: api.GPURef{UUID: f.uuids[1], Index: 1}, Spread: []api.GPURef{{UUID: f.uuids[free], Index: free}}, MemoryMiB: unitMiB, Cores: 1}}}
	if got := f.nriDecide(t, pair, over, ledger); codeOf(t, "nri.Decide", got.err) != gpureq.CodeMPSGroup {
		t.Errorf("g on GPUs 1 and %d: NRI %v, want %s", free, got.err, gpureq.CodeMPSGroup)
	}

	// The daemons the ledger needs: the set and b's GPU, each once.
	var groups gpureq.Groups
	for _, e := range ledger {
		groups.Add(e.Shared.UUIDs())
	}
	want := []string{gpureq.GroupKey(f.uuids[:2]), f.uuids[b[0]]}
	slices.Sort(want)
	if got := groups.Keys(); !slices.Equal(got, want) {
		t.Errorf("MPS groups of the ledger %v, want %v", got, want)
	}
}

type nriResult struct {
	err     error
	entry   nri.Entry
	indices []int
}

// nriDecide is the NRI decision for the pod's container "main" on the test
// node with ledger, with the assignment a (nil: placed locally).
func (f *fixture) nriDecide(t *testing.T, pod *corev1.Pod, a *api.Assignment, ledger []nri.Entry) nriResult {
	t.Helper()
	p := nri.Pod{Namespace: pod.Namespace, Name: pod.Name, UID: string(pod.UID), Annotations: map[string]string{}}
	for k, v := range pod.Annotations {
		p.Annotations[k] = v
	}
	if a != nil {
		if err := api.SetAssignment(p.Annotations, a); err != nil {
			t.Fatal(err)
		}
	}
	_, memU, cores := r0(pod).units()
	req := nri.Request{Pod: p, Container: nri.Container{ID: fmt.Sprint("id-", pod.Name), Name: "main"},
		Devices: nri.Devices{MemoryUnits: memU, CoreUnits: cores}}
	d, err := nri.Decide(f.nriOpt, &nri.Node{GPUs: f.nriGPU, Ledger: ledger}, req)
	if err != nil {
		var de *nri.DecisionError
		if !errors.As(err, &de) {
			t.Fatalf("%s: %v is not a DecisionError", pod.Name, err)
		}
		return nriResult{err: err}
	}
	out := nriResult{entry: d.Entry}
	for _, g := range d.Entry.Shared.GPUs() {
		out.indices = append(out.indices, g.Index)
	}
	return out
}

// r0 is the pod's container "main" as a row container.
func r0(pod *corev1.Pod) ctr {
	c := pod.Spec.Containers[0]
	q := func(name corev1.ResourceName) string {
		if v, ok := c.Resources.Limits[name]; ok {
			return v.String()
		}
		return ""
	}
	return ctr{name: c.Name, mem: q(api.ResourceGPUMemory), cores: q(api.ResourceGPUCore)}
}
