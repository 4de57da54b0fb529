package gang

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tessera-gpu/tessera/allocator"
)

// nodeBuilder makes planner nodes: makeNode("n1").GPUs(8).Used(0, 1).Obj().
type nodeBuilder struct{ n Node }

func makeNode(name string) *nodeBuilder {
	return &nodeBuilder{n: Node{
		Node:   &allocator.Node{Name: name, Model: "A100", CPUMilliCapacity: 128000, CPUMilliFree: 128000, MemMiBCapacity: 1 << 20, MemMiBFree: 1 << 20},
		Labels: map[string]string{},
	}}
}

func (b *nodeBuilder) GPUs(k int) *nodeBuilder {
	for i := 0; i < k; i++ {
		b.n.Node.GPUs = append(b.n.Node.GPUs, allocator.GPU{Index: i, MilliFree: allocator.MilliPerGPU, MemFreeMiB: 40960, MemTotalMiB: 40960})
	}
	return b
}

// Used marks whole GPUs (device indices) as taken.
func (b *nodeBuilder) Used(indices ...int) *nodeBuilder {
	for _, i := range indices {
		b.n.Node.GPUs[i].MilliFree, b.n.Node.GPUs[i].MemFreeMiB = 0, 0
	}
	return b
}

func (b *nodeBuilder) Label(k, v string) *nodeBuilder { b.n.Labels[k] = v; return b }

func (b *nodeBuilder) Cliques(c ...[]int) *nodeBuilder { b.n.Cliques = c; return b }

// NVSwitch8 gives the node one clique of all its GPUs.
func (b *nodeBuilder) NVSwitch() *nodeBuilder {
	var all []int
	for _, g := range b.n.Node.GPUs {
		all = append(all, g.Index)
	}
	return b.Cliques(all)
}

func (b *nodeBuilder) Obj() Node { return b.n }

// dgx1Cliques are the DGX-1 cube-mesh cliques (topology's dgx-1v model).
var dgx1Cliques = [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}, {0, 4}, {1, 5}, {2, 6}, {3, 7}}

func whole(name string, k int) Member {
	return Member{Name: name, Request: allocator.Request{CPUMilli: 1000, MemMiB: 1024, GPUs: k}}
}

func shared(name string, milli int64) Member {
	return Member{Name: name, Request: allocator.Request{CPUMilli: 500, MemMiB: 512, GPUMilli: milli, GPUMemMiB: 4096}}
}

func group(min int, members ...Member) Group {
	return Group{Namespace: "team", Name: "train", MinMember: min, Members: members}
}

func policy(t *testing.T) allocator.Policy {
	t.Helper()
	p, err := allocator.NewPolicy(allocator.PolicyBestFit)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// placed maps member name to node name.
func placed(p *Plan) map[string]string {
	out := map[string]string{}
	for _, pl := range p.Placements {
		out[pl.Member] = pl.Node
	}
	return out
}

func TestIncompleteGroupWaits(t *testing.T) {
	nodes := []Node{makeNode("n1").GPUs(8).Obj()}
	_, err := PlanGroup(group(4, whole("w0", 1), whole("w1", 1), whole("w2", 1)), nodes, policy(t))
	if !errors.Is(err, ErrIncomplete) {
		t.Fatalf("PlanGroup = %v, want ErrIncomplete", err)
	}
	if !strings.Contains(err.Error(), "3 of 4 members exist") {
		t.Errorf("error %q does not say how many members exist", err)
	}
}

func TestFourByEightNeedsThirtyTwoFreeGPUs(t *testing.T) {
	gang := group(4, whole("w0", 8), whole("w1", 8), whole("w2", 8), whole("w3", 8))
	// 24 free GPUs in all, but as three whole nodes plus scraps: no room.
	tight := []Node{
		makeNode("a").GPUs(8).NVSwitch().Obj(),
		makeNode("b").GPUs(8).NVSwitch().Obj(),
		makeNode("c").GPUs(8).Used(0).NVSwitch().Obj(),
		makeNode("d").GPUs(8).Used(0, 1, 2, 3, 4, 5, 6).NVSwitch().Obj(),
		makeNode("e").GPUs(8).Used(1, 2, 3, 4, 5, 6, 7).NVSwitch().Obj(),
	}
	_, err := PlanGroup(gang, tight, policy(t))
	if !errors.Is(err, ErrNoRoom) {
		t.Fatalf("PlanGroup with 24 free GPUs = %v, want ErrNoRoom", err)
	}
	if !strings.Contains(err.Error(), "4 members need 32 whole GPUs") {
		t.Errorf("error %q does not state the group's demand", err)
	}

	roomy := append(tight, makeNode("f").GPUs(8).NVSwitch().Obj(), makeNode("g").GPUs(8).NVSwitch().Obj())
	plan, err := PlanGroup(gang, roomy, policy(t))
	if err != nil {
		t.Fatalf("PlanGroup with 4 free nodes: %v", err)
	}
	nodes := map[string]bool{}
	for _, pl := range plan.Placements {
		if pl.GPUs.Len() != 8 || !pl.InClique {
			t.Errorf("%s: %d GPUs, in clique %v; want 8 in one clique", pl.Member, pl.GPUs.Len(), pl.InClique)
		}
		nodes[pl.Node] = true
	}
	if diff := cmp.Diff(map[string]bool{"a": true, "b": true, "f": true, "g": true}, nodes); diff != "" {
		t.Errorf("nodes used (-want +got):\n%s", diff)
	}
	// Planning reads the snapshots; it must not change them.
	if got := roomy[0].Node.FullyFreeGPUs(); got != 8 {
		t.Errorf("snapshot of node a changed: %d free GPUs, want 8", got)
	}
}

func TestCliquePreferredAndRequired(t *testing.T) {
	// Node "a" sorts first and has 4 free GPUs, but not in one clique;
	// node "b" has a free quad.
	nodes := []Node{
		makeNode("a").GPUs(8).Used(2, 3, 6, 7).Cliques(dgx1Cliques...).Obj(),
		makeNode("b").GPUs(8).Used(0, 1, 2, 3).Cliques(dgx1Cliques...).Obj(),
	}
	plan, err := PlanGroup(group(1, whole("w", 4)), nodes, policy(t))
	if err != nil {
		t.Fatal(err)
	}
	want := Placement{Member: "w", Node: "b", GPUs: allocator.GPUSet(0).With(4).With(5).With(6).With(7), InClique: true}
	if diff := cmp.Diff(want, plan.Placements[0]); diff != "" {
		t.Errorf("placement (-want +got):\n%s", diff)
	}

	// Without any free quad, a preference falls back; a requirement fails.
	noQuad := []Node{nodes[0]}
	plan, err = PlanGroup(group(1, whole("w", 4)), noQuad, policy(t))
	if err != nil {
		t.Fatalf("preferred clique must fall back: %v", err)
	}
	if pl := plan.Placements[0]; pl.Node != "a" || pl.InClique {
		t.Errorf("placement = %+v, want node a outside a clique", pl)
	}
	required := whole("w", 4)
	required.NVLink = true
	if _, err := PlanGroup(group(1, required), noQuad, policy(t)); !errors.Is(err, ErrNoRoom) {
		t.Errorf("required clique on a node without one = %v, want ErrNoRoom", err)
	}
	// A pair clique {0,4} serves a 2-GPU member that needs NVLink.
	pair := whole("p", 2)
	pair.NVLink = true
	plan, err = PlanGroup(group(1, pair), []Node{makeNode("c").GPUs(8).Used(1, 2, 3, 5, 6, 7).Cliques(dgx1Cliques...).Obj()}, policy(t))
	if err != nil {
		t.Fatal(err)
	}
	if got := plan.Placements[0].GPUs; got != allocator.GPUSet(0).With(0).With(4) {
		t.Errorf("pair placed on GPUs %v, want 0-4", got)
	}
}

func TestTopologyLevels(t *testing.T) {
	rack := func(name, r string, used ...int) Node {
		return makeNode(name).GPUs(8).Used(used...).NVSwitch().Label("rack", r).Obj()
	}
	gang := group(2, whole("w0", 8), whole("w1", 8))
	tests := []struct {
		name       string
		nodes      []Node
		levels     []Level
		wantDomain string
		wantNodes  map[string]string
		wantErr    string
		// wantUnlabelled are the preferred levels no node carries.
		wantUnlabelled []string
	}{
		{
			name:       "lands in the one rack with room",
			nodes:      []Node{rack("a1", "r1"), rack("a2", "r1", 0), rack("b1", "r2"), rack("b2", "r2")},
			levels:     []Level{{Key: "rack"}},
			wantDomain: "r2",
			wantNodes:  map[string]string{"w0": "b1", "w1": "b2"},
		},
		{
			name:       "prefers the tightest rack that fits",
			nodes:      []Node{rack("a1", "r1"), rack("a2", "r1"), rack("a3", "r1"), rack("b1", "r2"), rack("b2", "r2")},
			levels:     []Level{{Key: "rack"}},
			wantDomain: "r2",
			wantNodes:  map[string]string{"w0": "b1", "w1": "b2"},
		},
		{
			// A mistyped level key matches no node: planned as without
			// it, and the plan says which level matched nothing.
			name:           "preferred level no node carries",
			nodes:          []Node{rack("a1", "r1"), rack("a2", "r1"), rack("b1", "r2"), rack("b2", "r2", 0)},
			levels:         []Level{{Key: "rakc"}, {Key: "rack"}},
			wantDomain:     "r1",
			wantNodes:      map[string]string{"w0": "a1", "w1": "a2"},
			wantUnlabelled: []string{"rakc"},
		},
		{
			name:      "preferred level falls back to the cluster",
			nodes:     []Node{rack("a1", "r1"), rack("a2", "r1", 0), rack("b1", "r2"), rack("b2", "r2", 7)},
			levels:    []Level{{Key: "rack"}},
			wantNodes: map[string]string{"w0": "a1", "w1": "b1"},
		},
		{
			name:    "required level does not fall back",
			nodes:   []Node{rack("a1", "r1"), rack("a2", "r1", 0), rack("b1", "r2"), rack("b2", "r2", 7)},
			levels:  []Level{{Key: "rack", Required: true}},
			wantErr: "within one rack; tried rack=r1, rack=r2",
		},
		{
			// Free nodes, but none labelled with the required level (an
			// NVLink domain label the nodes do not carry, say): the reason
			// names the missing label, not a lack of room alone.
			name:    "required level no node carries",
			nodes:   []Node{rack("a1", "r1"), rack("a2", "r1")},
			levels:  []Level{{Key: "nvidia.com/gpu.clique", Required: true}},
			wantErr: "within one nvidia.com/gpu.clique, and no node it may use has the label nvidia.com/gpu.clique",
		},
		{
			name: "lowest level first",
			nodes: []Node{
				makeNode("a1").GPUs(8).NVSwitch().Label("rack", "r1").Label("block", "x").Obj(),
				makeNode("a2").GPUs(8).NVSwitch().Label("rack", "r1").Label("block", "y").Obj(),
				makeNode("a3").GPUs(8).NVSwitch().Label("rack", "r1").Label("block", "y").Obj(),
			},
			levels:     []Level{{Key: "block"}, {Key: "rack"}},
			wantDomain: "y",
			wantNodes:  map[string]string{"w0": "a2", "w1": "a3"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g := gang
			g.Levels = tc.levels
			plan, err := PlanGroup(g, tc.nodes, policy(t))
			if tc.wantErr != "" {
				if !errors.Is(err, ErrNoRoom) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("PlanGroup = %v, want ErrNoRoom containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if plan.Domain != tc.wantDomain {
				t.Errorf("domain = %q (level %q), want %q", plan.Domain, plan.Level, tc.wantDomain)
			}
			if diff := cmp.Diff(tc.wantNodes, placed(plan)); diff != "" {
				t.Errorf("placements (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantUnlabelled, plan.Unlabelled); diff != "" {
				t.Errorf("unlabelled levels (-want +got):\n%s", diff)
			}
		})
	}
}

func TestMembersShareNodesWithinThePlan(t *testing.T) {
	// Two 4-GPU members and six half-GPU slices fit on one 8-GPU node plus
	// three GPUs of another only if the plan counts each member it places.
	nodes := []Node{
		makeNode("a").GPUs(8).NVSwitch().Obj(),
		makeNode("b").GPUs(8).Used(3, 4, 5, 6, 7).NVSwitch().Obj(),
	}
	members := []Member{whole("w0", 4), whole("w1", 4)}
	for _, n := range []string{"s0", "s1", "s2", "s3", "s4", "s5"} {
		members = append(members, shared(n, 500))
	}
	plan, err := PlanGroup(group(len(members), members...), nodes, policy(t))
	if err != nil {
		t.Fatal(err)
	}
	ledger := map[string]*allocator.Node{"a": nodes[0].Node.Clone(), "b": nodes[1].Node.Clone()}
	for i, pl := range plan.Placements {
		if err := allocator.Apply(ledger[pl.Node], members[i].Request, pl.GPUs); err != nil {
			t.Fatalf("plan over-commits: %s on %s GPUs %v: %v", pl.Member, pl.Node, pl.GPUs, err)
		}
	}
	// One more whole GPU anywhere would not fit: the plan used the room.
	_, err = PlanGroup(group(len(members)+1, append(members, whole("w2", 4))...), nodes, policy(t))
	if !errors.Is(err, ErrNoRoom) {
		t.Errorf("a group that cannot fit = %v, want ErrNoRoom", err)
	}
}

func TestInvalidMember(t *testing.T) {
	bad := Member{Name: "x", Request: allocator.Request{GPUs: 1, GPUMilli: 500}}
	_, err := PlanGroup(group(1, bad), []Node{makeNode("a").GPUs(1).Obj()}, policy(t))
	if err == nil || !strings.Contains(err.Error(), "member x") {
		t.Fatalf("PlanGroup with an invalid member = %v, want an error naming it", err)
	}
}

func TestAllowedKeepsMembersOffNodes(t *testing.T) {
	// b0 is the tightest fit for 6 GPUs; the members may run on pool a only.
	nodes := []Node{
		makeNode("a0").GPUs(8).Label("pool", "a").Obj(),
		makeNode("a1").GPUs(8).Label("pool", "a").Obj(),
		makeNode("b0").GPUs(8).Used(6, 7).Label("pool", "b").Obj(),
	}
	poolA := func(n Node) bool { return n.Labels["pool"] == "a" }
	m0, m1 := whole("w0", 6), whole("w1", 6)
	p, err := PlanGroup(group(2, m0, m1), nodes, policy(t))
	if err != nil {
		t.Fatal(err)
	}
	if got := placed(p); got["w0"] != "b0" && got["w1"] != "b0" {
		t.Fatalf("without Allowed: %v, want one member on the tightest fit b0 (else this test proves nothing)", got)
	}
	m0.Allowed, m1.Allowed = poolA, poolA
	p, err = PlanGroup(group(2, m0, m1), nodes, policy(t))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]string{"w0": "a0", "w1": "a1"}, placed(p)); diff != "" {
		t.Errorf("with Allowed (-want +got):\n%s", diff)
	}
	// Only b0 has room for a third member: not allowed, so no plan.
	m2 := whole("w2", 6)
	m2.Allowed = poolA
	if _, err := PlanGroup(group(3, m0, m1, m2), nodes, policy(t)); !errors.Is(err, ErrNoRoom) {
		t.Errorf("three members of pool a on two pool-a nodes: %v, want ErrNoRoom", err)
	}
}

// The no-room error speaks of a gang's members, or of a pod outside any
// gang (a queued pod planned as a group of one), in singular where it is
// one GPU.
func TestNoRoomMessages(t *testing.T) {
	full := []Node{makeNode("a").GPUs(2).Used(0, 1).Obj()}
	for _, tc := range []struct {
		name string
		g    Group
		want string
	}{
		{"gang", group(2, whole("w0", 1), whole("w1", 1)), "gang team/train: no room for the whole group: 2 members need 2 whole GPUs and 2.0 GPUs in all"},
		{"gang of one member", group(1, whole("w0", 1)), "gang team/train: no room for the whole group: 1 member needs 1 whole GPU and 1.0 GPUs in all"},
		{"a pod", func() Group { g := group(1, whole("w0", 2)); g.Single = true; return g }(), "pod team/train: no room: it needs 2 whole GPUs and 2.0 GPUs in all"},
	} {
		_, err := PlanGroup(tc.g, full, policy(t))
		if !errors.Is(err, ErrNoRoom) || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error starting %q", tc.name, err, tc.want)
		}
	}
}
