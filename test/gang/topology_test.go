package gang_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tessera-gpu/tessera/test/framework/extenderenv"
)

// TestGangLandsInOneRack: a gang of 2 members of 6 whole GPUs (one node
// each) on two racks. Rack r1 has two free nodes; rack r2 has a node with
// exactly 6 free GPUs (the tightest fit: where a binpacking, rack-blind
// placement puts the first member) and a full node. With the rack level
// (--gang-levels=rack) the gang lands in r1 whole. The control run without
// levels shows the same cluster splits the gang across the racks, so the
// first run could have failed.
func TestGangLandsInOneRack(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		oneRack bool
	}{
		{"rack level", []string{"--gang-levels=rack"}, true},
		{"control: no levels", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := start(t, tc.args...)
			w := e.WatchPods(t)
			rack := map[string]string{"r1-a": "r1", "r1-b": "r1", "r2-a": "r2", "r2-b": "r2"}
			for _, n := range []string{"r1-a", "r1-b", "r2-a", "r2-b"} {
				e.CreateNode(t, h100Node(n, map[string]string{"rack": rack[n]}))
			}
			// Existing workloads: 2 GPUs on r2-a, all 8 on r2-b.
			e.CreatePod(t, extenderenv.PodSpec{Name: "busy-r2-a", GPUs: 2, Node: "r2-a", Assign: extenderenv.WholeAssignment("r2-a", 6, 7)})
			e.CreatePod(t, extenderenv.PodSpec{Name: "busy-r2-b", GPUs: 8, Node: "r2-b", Assign: extenderenv.WholeAssignment("r2-b", 0, 1, 2, 3, 4, 5, 6, 7)})
			for i := range 2 {
				createMember(t, e, "tg", 2, i, 6)
			}
			times := waitWhole(t, e, w, "tg", 2, 60*time.Second)
			racks := map[string]bool{}
			nodes := map[string]bool{}
			for i := range 2 {
				p := e.GetPod(t, ns, fmt.Sprintf("tg-%d", i))
				racks[rack[p.Spec.NodeName]] = true
				nodes[p.Spec.NodeName] = true
			}
			ev := e.WaitEvent(t, ns, "tg-0", "GangPlanned", "", 10*time.Second)
			t.Logf("members on %v (racks %v), spread %s; %s", nodes, racks, extenderenv.Spread(times).Round(time.Millisecond), strings.TrimSpace(ev))
			if len(nodes) != 2 {
				t.Errorf("members on %v, want 2 nodes", nodes)
			}
			switch {
			case tc.oneRack && (len(racks) != 1 || !racks["r1"]):
				t.Errorf("gang in racks %v, want it whole in r1 (the only rack with room)", racks)
			case tc.oneRack && !strings.Contains(ev, "planned in rack=r1"):
				t.Errorf("GangPlanned event does not name rack=r1: %s", ev)
			case !tc.oneRack && len(racks) != 2:
				t.Errorf("control: without levels the gang landed in racks %v; the scenario no longer tempts a rack-blind placement, so the rack test proves nothing", racks)
			}
		})
	}
}
