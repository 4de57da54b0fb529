package extender

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"

	"github.com/tessera-gpu/tessera/extender/internal/testbuild"
)

// migStatusFixture is migNode m (GPUs 0-1: 7 × 1g.5gb, 2-3: 3g.20gb +
// 2g.10gb + 1g.5gb, 4-7 whole) with: default/big holding GPU 2's 3g.20gb,
// default/two two 1g.5gb of GPU 0, default/w GPU 4 whole, default/new
// bound and asking a 1g.5gb the node agent has not recorded yet, and
// default/wait pending for a 2g.10gb.
func migStatusFixture(t *testing.T) *Snapshot {
	t.Helper()
	nodes := []*corev1.Node{migNode("m")}
	pods := []*corev1.Pod{
		migPod("big", "3g.20gb", 1).Node("m").HoldingMIG("3g.20gb", [2]int{2, 0}).Obj(),
		migPod("two", "1g.5gb", 2).Node("m").HoldingMIG("1g.5gb", [2]int{0, 0}, [2]int{0, 1}).Obj(),
		testbuild.Pod("w").Whole(1).Node("m").Holding(4).Obj(),
		migPod("new", "1g.5gb", 1).Node("m").Obj(),
		migPod("wait", "2g.10gb", 1).Obj(),
	}
	for _, p := range pods {
		p.Status.Phase = corev1.PodRunning
		if p.Spec.NodeName == "" {
			p.Status.Phase = corev1.PodPending
		}
	}
	s := NewStatus(newTestCache(t, nodes, pods), nil, nil, func() ([]*corev1.Pod, error) { return pods, nil })
	s.now = func() time.Time { return time.Date(2026, 11, 24, 1, 0, 0, 0, time.UTC) }
	return take(t, s)
}

// TestOccupancyViewMIG: a GPU in MIG mode is never free; its row lists
// its instances and the pods holding them, and pods whose instances are
// not recorded yet are listed under the node.
func TestOccupancyViewMIG(t *testing.T) {
	c := OccupancyView(migStatusFixture(t))
	if len(c.Nodes) != 1 {
		t.Fatalf("nodes = %d, want 1", len(c.Nodes))
	}
	n := c.Nodes[0]
	type gpu struct {
		Use   string
		Whole []string
		// Held are the instances' holders by instance ("" free).
		Held []string
	}
	var got []gpu
	for _, g := range n.GPUs {
		o := gpu{Use: g.Use(), Whole: g.Whole}
		if g.MIG != nil {
			for _, in := range g.MIG.Instances {
				o.Held = append(o.Held, in.Pod)
			}
		}
		got = append(got, o)
	}
	seven := func(held ...string) []string { return append(held, make([]string, 7-len(held))...) }
	want := []gpu{
		{Use: "mig", Held: seven("default/two", "default/two")},
		{Use: "mig", Held: seven()},
		{Use: "mig", Held: []string{"default/big", "", ""}},
		{Use: "mig", Held: []string{"", "", ""}},
		{Use: "whole", Whole: []string{"default/w"}},
		{Use: "free"}, {Use: "free"}, {Use: "free"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("GPUs (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"default/new: 1 MIG instance 1g.5gb"}, n.UnrecordedMIG); diff != "" {
		t.Errorf("unrecorded MIG (-want +got):\n%s", diff)
	}
}

// TestPodViewMIG: the extender's view of a placed MIG pod says what its
// ledger counts, as it does for whole GPUs and slices.
func TestPodViewMIG(t *testing.T) {
	snap := migStatusFixture(t)
	gpu := func(i int) string { return fmt.Sprintf("GPU %d (A100, %s)", i, testbuild.GPUUUID("m", i)) }
	for _, tc := range []struct {
		name string
		want []string
	}{
		{"big", []string{"MIG 3g.20gb " + testbuild.MIGUUID("m", 2, 0) + " on " + gpu(2) + " (container main)"}},
		{"two", []string{
			"MIG 1g.5gb " + testbuild.MIGUUID("m", 0, 0) + " on " + gpu(0) + " (container main)",
			"MIG 1g.5gb " + testbuild.MIGUUID("m", 0, 1) + " on " + gpu(0) + " (container main)",
		}},
		{"new", []string{"1 MIG instance 1g.5gb, not recorded by the node agent yet"}},
		{"w", []string{gpu(4)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := PodView(snap, "default", tc.name)
			if got == nil || got.Node != "m" || got.Pending != nil {
				t.Fatalf("PodView = %+v, want placed on m", got)
			}
			if diff := cmp.Diff(tc.want, got.GPUs); diff != "" {
				t.Errorf("GPUs (-want +got):\n%s", diff)
			}
		})
	}
	if p := PodView(snap, "default", "wait"); p == nil || p.Pending == nil || p.Pending.Demand != "1 MIG instance 2g.10gb" {
		t.Errorf("PodView(wait) = %+v, want pending, asking for 1 MIG instance 2g.10gb", p)
	}
}

func TestDescribeDemandMIG(t *testing.T) {
	mixed := migPod("p", "1g.5gb", 2)
	mixed.Limit("tessera.dev/mig-3g.20gb", 1)
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		want string
	}{
		{"one instance", migPod("p", "1g.5gb", 1).Obj(), "1 MIG instance 1g.5gb"},
		{"two of a profile", migPod("p", "1g.5gb", 2).Obj(), "2 MIG instances 1g.5gb"},
		{"two profiles, in name order", mixed.Obj(), "2 MIG instances 1g.5gb, 1 MIG instance 3g.20gb"},
		{"whole GPUs", testbuild.Pod("p").Whole(2).Obj(), "2 whole GPU(s)"},
		{"nothing", testbuild.Pod("p").CPU("1").Obj(), "no GPU"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := ParseDemand(tc.pod)
			if err != nil {
				t.Fatal(err)
			}
			if got := DescribeDemand(&d); got != tc.want {
				t.Errorf("DescribeDemand = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestStatusMetricsMIG: GPUs in MIG mode count under use "mig", never
// "free".
func TestStatusMetricsMIG(t *testing.T) {
	snap := migStatusFixture(t)
	got := map[string]float64{}
	for _, m := range StatusMetrics(snap, nil) {
		if m.Desc() != descGPUs {
			continue
		}
		var pb dto.Metric
		if err := m.Write(&pb); err != nil {
			t.Fatal(err)
		}
		got[labelString(&pb)] = pb.GetGauge().GetValue()
	}
	for key, want := range map[string]float64{
		`{model="A100",node="m",use="mig"}`:       4,
		`{model="A100",node="m",use="whole"}`:     1,
		`{model="A100",node="m",use="free"}`:      3,
		`{model="A100",node="m",use="unhealthy"}`: 0,
	} {
		if v, ok := got[key]; !ok || v != want {
			t.Errorf("tessera_extender_gpus%s = %v (present %v), want %v", key, v, ok, want)
		}
	}
}

// TestStatusPageMIG: the status page shows a GPU in MIG mode as such, with
// its instances' use and holders, and the pods not recorded yet.
func TestStatusPageMIG(t *testing.T) {
	snap := migStatusFixture(t)
	page, err := RenderPage(PageView(snap, time.Date(2026, 11, 24, 1, 0, 0, 0, time.UTC)))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`<tr class="first" data-node="m" data-gpu="0">`,
		`<td class="mig">mig</td><td colspan="2">2/7 instances used</td>` + "\n" + `<td class="pods">default/two (1g.5gb, 1g.5gb)</td>`,
		`<td class="mig">mig</td><td colspan="2">1/3 instances used</td>` + "\n" + `<td class="pods">default/big (3g.20gb)</td>`,
		`<td class="mig">mig</td><td colspan="2">instances not recorded yet</td><td class="pods">default/new: 1 MIG instance 1g.5gb</td>`,
	} {
		if !strings.Contains(string(page), want) {
			t.Errorf("the page lacks %q:\n%s", want, page)
		}
	}
}
