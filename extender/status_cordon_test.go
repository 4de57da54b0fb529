package extender

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"

	"github.com/tessera-gpu/tessera/extender/internal/testbuild"
)

// TestStatusCordonedNode: the views mark a cordoned node, whose free GPUs
// take no new pod (they showed as plain free): the occupancy's Cordoned,
// the status page, and tessera_extender_node_cordoned beside
// tessera_extender_gpus, whose free still counts them (documented).
func TestStatusCordonedNode(t *testing.T) {
	cordoned := testbuild.Node("c").GPUs(2, "NVIDIA A100-SXM4-40GB", 40960).Obj()
	cordoned.Spec.Unschedulable = true
	nodes := []*corev1.Node{cordoned, testbuild.Node("d").GPUs(2, "NVIDIA A100-SXM4-40GB", 40960).Obj()}
	s := NewStatus(newTestCache(t, nodes, nil), nil, nil, func() ([]*corev1.Pod, error) { return nil, nil })
	snap := take(t, s)

	got := map[string]bool{}
	for _, n := range OccupancyView(snap).Nodes {
		got[n.Name] = n.Cordoned
	}
	if diff := cmp.Diff(map[string]bool{"c": true, "d": false}, got); diff != "" {
		t.Errorf("Cordoned (-want +got):\n%s", diff)
	}

	page, err := RenderPage(PageView(snap, time.Now()))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`<td>c <span class="bad">(cordoned)</span></td>`, `<td class="free">free, cordoned</td>`} {
		if !strings.Contains(string(page), want) {
			t.Errorf("the page lacks %q", want)
		}
	}
	if n := strings.Count(string(page), "cordoned"); n != 3 { // c's mark and its two free GPUs
		t.Errorf("the page says cordoned %d times, want 3 (node c and its 2 GPUs):\n%s", n, page)
	}

	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(s.Collector())
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	metrics := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			metrics[f.GetName()+labelString(m)] = m.GetGauge().GetValue()
		}
	}
	for key, want := range map[string]float64{
		`tessera_extender_node_cordoned{node="c"}`:                          1,
		`tessera_extender_node_cordoned{node="d"}`:                          0,
		`tessera_extender_gpus{model="A100-SXM4-40GB",node="c",use="free"}`: 2,
		`tessera_extender_gpus{model="A100-SXM4-40GB",node="d",use="free"}`: 2,
	} {
		if v, ok := metrics[key]; !ok || v != want {
			t.Errorf("%s = %v (present %v), want %v", key, v, ok, want)
		}
	}
}
