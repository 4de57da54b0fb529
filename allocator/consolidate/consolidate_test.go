package consolidate

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"
)

// pods are 1-GPU pods named prefix-<pos> on the positions given.
func pods(prefix string, movable bool, positions ...int) []Pod {
	out := make([]Pod, len(positions))
	for i, pos := range positions {
		out[i] = Pod{Name: fmt.Sprintf("%s-%d", prefix, pos), GPUs: []int{pos}, Movable: movable}
	}
	return out
}

// pinned makes ps may run only on the nodes named.
func pinned(ps []Pod, nodes ...string) []Pod {
	for i := range ps {
		ps[i].MayRunOn = func(n string) bool { return slices.Contains(nodes, n) }
	}
	return ps
}

// cpu gives ps a CPU request of milli each.
func cpu(ps []Pod, milli int64) []Pod {
	for i := range ps {
		ps[i].CPUMilli = milli
	}
	return ps
}

// room gives n milli CPU free.
func room(n Node, milli int64) Node {
	n.CPUMilli = milli
	return n
}

func node8(name string, ps ...[]Pod) Node {
	n := Node{Name: name, GPUs: 8, Eligible: true}
	for _, p := range ps {
		n.Pods = append(n.Pods, p...)
	}
	return n
}

// dgx1 has two 4-GPU NVLink cliques.
func dgx1(name string, ps ...[]Pod) Node {
	n := node8(name, ps...)
	n.Cliques = [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}
	return n
}

func moved(p Plan) []string {
	var out []string
	for _, m := range p.Moves {
		out = append(out, m.Node+"/"+m.Pod)
	}
	slices.Sort(out)
	return out
}

func TestDecide(t *testing.T) {
	full := func(name string) Node { return node8(name, pods(name+"-x", false, 0, 1, 2, 3, 4, 5, 6, 7)) }
	rack := func(n Node, r string) Node { n.Domain = r; return n }
	ineligible := func(n Node) Node { n.Eligible = false; return n }
	for _, tc := range []struct {
		name   string
		nodes  []Node
		w      Workload
		budget int
		want   []string // moves (node/pod), sorted
		place  []string
		err    error
	}{
		{
			name:  "fits already",
			nodes: []Node{node8("a", pods("p", true, 0))},
			w:     Workload{Members: []int{4}}, budget: 10, err: ErrFits,
		},
		{
			name: "one pod on each of two nodes: the 8-GPU member gets one node, its pod moves to the other",
			nodes: []Node{
				node8("a", pods("a", true, 3)),
				node8("b", pods("b", true, 5)),
			},
			w: Workload{Members: []int{8}}, budget: 10,
			want: []string{"a/a-3"}, place: []string{"a"},
		},
		{
			name: "a 2 x 8 gang: the two nodes with the fewest pods to move, the pods fit on the third",
			nodes: []Node{
				node8("a", pods("a", true, 0, 1)),
				node8("b", pods("b", true, 0, 2, 4, 6)),
				node8("c", pods("c", true, 7)),
			},
			w: Workload{Members: []int{8, 8}}, budget: 10,
			want: []string{"a/a-0", "a/a-1", "c/c-7"}, place: []string{"a", "c"},
		},
		{
			name: "a pod that may not move keeps its node out",
			nodes: []Node{
				node8("a", pods("a", false, 0)),
				node8("b", pods("b", true, 0, 1, 2)),
				node8("c", pods("c", true, 0, 1)),
			},
			w: Workload{Members: []int{8}}, budget: 10,
			want: []string{"c/c-0", "c/c-1"}, place: []string{"c"},
		},
		{
			name: "NVLink: the clique with the fewest pods is freed, not any four GPUs",
			nodes: []Node{
				dgx1("v", pods("v", true, 0, 5, 6)),
				full("f"),
				node8("spare", pods("s", false, 0, 1, 2, 3, 4)),
			},
			w: Workload{Members: []int{4}, NVLink: true}, budget: 10,
			want: []string{"v/v-0"}, place: []string{"v"},
		},
		{
			name: "without NVLink the same node needs no move",
			nodes: []Node{
				dgx1("v", pods("v", true, 0, 5, 6, 7)),
				full("f"),
			},
			w: Workload{Members: []int{4}}, budget: 10, err: ErrFits,
		},
		{
			name: "the pod that would move may run only on its own node: the other node is freed",
			nodes: []Node{
				node8("a", pinned(pods("a", true, 3), "a")),
				node8("b", pods("b", true, 5)),
			},
			w: Workload{Members: []int{8}}, budget: 10,
			want: []string{"b/b-5"}, place: []string{"b"},
		},
		{
			name: "the moved pod may run only on a full node: no plan",
			nodes: []Node{
				node8("a", pinned(pods("a", true, 0), "a", "b")),
				full("b"),
				node8("c", pods("c", false, 0, 1, 2, 3)),
			},
			w: Workload{Members: []int{8}}, budget: 10, err: ErrNoPlan,
		},
		{
			name: "the moved pod's CPU is free nowhere else: no plan",
			nodes: []Node{
				node8("a", cpu(pods("a", true, 0), 8000)),
				room(node8("b", pods("b-x", false, 0, 1, 2, 3)), 4000),
			},
			w: Workload{Members: []int{8}}, budget: 10, err: ErrNoPlan,
		},
		{
			name: "the moved pod's CPU is free on the other node",
			nodes: []Node{
				node8("a", cpu(pods("a", true, 0), 8000)),
				room(node8("b", pods("b-x", false, 0, 1, 2, 3)), 16000),
			},
			w: Workload{Members: []int{8}}, budget: 10,
			want: []string{"a/a-0"}, place: []string{"a"},
		},
		{
			name: "the moved pod comes back beside the member, whose CPU leaves it enough",
			nodes: []Node{
				room(dgx1("a", pods("a-x", false, 0), cpu(pods("a", true, 4), 2000)), 3000),
			},
			w: Workload{Members: []int{4}, NVLink: true, CPUMilli: []int64{1000}}, budget: 10,
			want: []string{"a/a-4"}, place: []string{"a"},
		},
		{
			name: "the moved pod could come back beside the member, whose CPU leaves it too little",
			nodes: []Node{
				room(dgx1("a", pods("a-x", false, 0), cpu(pods("a", true, 4), 2000)), 3000),
			},
			w: Workload{Members: []int{4}, NVLink: true, CPUMilli: []int64{4000}}, budget: 10, err: ErrNoPlan,
		},
		{
			name: "a moved 2-GPU pod fits on the two GPUs left free in two cliques",
			nodes: []Node{
				dgx1("a", []Pod{{Name: "a-x", GPUs: []int{0, 1}, Movable: true}}),
				dgx1("b", pods("b-x", false, 0, 1, 2, 4, 5, 6)),
			},
			w: Workload{Members: []int{8}}, budget: 10,
			want: []string{"a/a-x"}, place: []string{"a"},
		},
		{
			name: "a moved 2-GPU pod that needs NVLink finds no clique with two GPUs free: no plan",
			nodes: []Node{
				dgx1("a", []Pod{{Name: "a-x", GPUs: []int{0, 1}, Movable: true, NVLink: true}}),
				dgx1("b", pods("b-x", false, 0, 1, 2, 4, 5, 6)),
			},
			w: Workload{Members: []int{8}}, budget: 10, err: ErrNoPlan,
		},
		{
			name: "the moved pod has nowhere to go",
			nodes: []Node{
				node8("a", pods("a", true, 0)),
				full("b"),
			},
			w: Workload{Members: []int{8}}, budget: 10, err: ErrNoPlan,
		},
		{
			name: "more moves than the budget: none",
			nodes: []Node{
				node8("a", pods("a", true, 0, 1, 2)),
				node8("b", pods("b", true, 0, 1, 2)),
				ineligible(node8("spare")),
			},
			w: Workload{Members: []int{8, 8}}, budget: 5, err: ErrBudget,
		},
		{
			name: "the same within budget",
			nodes: []Node{
				node8("a", pods("a", true, 0, 1, 2)),
				node8("b", pods("b", true, 0, 1, 2)),
				ineligible(node8("spare")),
			},
			w: Workload{Members: []int{8, 8}}, budget: 6,
			want: []string{"a/a-0", "a/a-1", "a/a-2", "b/b-0", "b/b-1", "b/b-2"}, place: []string{"a", "b"},
		},
		{
			name: "only the pods the member needs gone move: 4 of 8 on a node half free",
			nodes: []Node{
				node8("a", pods("a", true, 0, 1, 2, 3)),
				node8("b", pods("b", false, 0, 1, 2, 3)),
			},
			w: Workload{Members: []int{6}}, budget: 10,
			want: []string{"a/a-0", "a/a-1"}, place: []string{"a"},
		},
		{
			name: "two slices on one GPU: both move, or the GPU is not free",
			nodes: []Node{
				node8("a", pods("a", false, 0, 1, 2, 3, 4, 5, 6), []Pod{{Name: "s1", GPUs: []int{7}, Movable: true}, {Name: "s2", GPUs: []int{7}, Movable: true}}),
				node8("b", []Pod{{Name: "t1", GPUs: []int{0}, Movable: true}, {Name: "t2", GPUs: []int{0}, Movable: true}}, pods("b", false, 1, 2, 3, 4, 5)),
				node8("c", pods("c", false, 0, 1, 2, 3, 4, 5)),
			},
			w: Workload{Members: []int{3}}, budget: 10,
			want: []string{"b/t1", "b/t2"}, place: []string{"b"},
		},
		{
			name: "one slice of a shared GPU may not move: that GPU is never freed",
			nodes: []Node{
				node8("a", pods("a", false, 0, 1, 2, 3, 4, 5, 6), []Pod{{Name: "s1", GPUs: []int{7}, Movable: true}, {Name: "s2", GPUs: []int{7}}}),
				node8("c", pods("c", false, 0, 1, 2, 3, 4, 5)),
			},
			w: Workload{Members: []int{3}}, budget: 10, err: ErrNoPlan,
		},
		{
			name: "one rack: the rack that needs fewer moves, though another node elsewhere is cheaper",
			nodes: []Node{
				rack(node8("a", pods("a", true, 0)), "r1"),
				rack(node8("b", pods("b", true, 0, 1, 2)), "r1"),
				rack(node8("c", pods("c", true, 0, 1)), "r2"),
				rack(node8("d", pods("d", true, 0, 1)), "r2"),
				rack(node8("e"), "r3"),
			},
			w: Workload{Members: []int{8, 8}, OneDomain: true}, budget: 10,
			want: []string{"a/a-0", "b/b-0", "b/b-1", "b/b-2"}, place: []string{"a", "b"},
		},
		{
			name: "a node the workload may not use takes the moved pods",
			nodes: []Node{
				node8("a", pods("a", true, 0, 1)),
				ineligible(node8("gpu-other-model")),
				full("b"),
			},
			w: Workload{Members: []int{8}}, budget: 10,
			want: []string{"a/a-0", "a/a-1"}, place: []string{"a"},
		},
		{
			name: "GPUs of unknown position are never freed",
			nodes: []Node{
				{Name: "a", GPUs: 8, Eligible: true, Unknown: 1, Pods: pods("a", true, 0)},
				node8("b"),
			},
			w: Workload{Members: []int{8, 8}}, budget: 10, err: ErrNoPlan,
		},
		{
			name:  "no eligible node",
			nodes: []Node{ineligible(node8("a", pods("a", true, 0)))},
			w:     Workload{Members: []int{8}}, budget: 10, err: ErrNoPlan,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := Decide(tc.nodes, tc.w, tc.budget, nil)
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("err %v, want %v (plan %v)", err, tc.err, p)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := moved(p); !slices.Equal(got, tc.want) {
				t.Errorf("moves %v, want %v", got, tc.want)
			}
			if !slices.Equal(p.Placement, tc.place) {
				t.Errorf("placement %v, want %v", p.Placement, tc.place)
			}
		})
	}
}

// The caller's judge decides, and every move it does not need is given
// back.
func TestDecideWithJudge(t *testing.T) {
	nodes := []Node{
		node8("a", pods("a", true, 0, 1)),
		node8("b", pods("b", true, 0)),
	}
	w := Workload{Members: []int{8}}
	never := func([]Move) bool { return false }
	if _, err := Decide(nodes, w, 10, never); !errors.Is(err, ErrFits) && !errors.Is(err, ErrNoPlan) {
		t.Fatalf("a judge that never fits: err %v, want ErrNoPlan", err)
	}
	// A judge that wants node a (say, a required label): a's two pods
	// move, b's stays.
	onA := func(m []Move) bool {
		gone := map[string]bool{}
		for _, x := range m {
			gone[x.Pod] = true
		}
		return gone["a-0"] && gone["a-1"]
	}
	p, err := Decide(nodes, w, 10, onA)
	if err != nil {
		t.Fatal(err)
	}
	if got := moved(p); !slices.Equal(got, []string{"a/a-0", "a/a-1"}) {
		t.Errorf("moves %v, want a's two pods", got)
	}
}

func TestBudget(t *testing.T) {
	now := time.Date(2026, 11, 24, 10, 0, 0, 0, time.UTC)
	recent := []time.Time{now.Add(-90 * time.Second), now.Add(-59 * time.Second), now.Add(-time.Second), now}
	if got := Budget(now, recent, 4); got != 1 {
		t.Errorf("Budget = %d, want 1 (three moves in the last minute)", got)
	}
	if got := Budget(now, recent, 2); got != 0 {
		t.Errorf("Budget = %d, want 0", got)
	}
	if got := Budget(now.Add(time.Minute), recent, 2); got != 2 {
		t.Errorf("a minute later: Budget = %d, want 2", got)
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name  string
		nodes []Node
		w     Workload
	}{
		{"no members", []Node{node8("a")}, Workload{}},
		{"a member of 0 GPUs", []Node{node8("a")}, Workload{Members: []int{0}}},
		{"a node twice", []Node{node8("a"), node8("a")}, Workload{Members: []int{1}}},
		{"CPU requests for fewer members", []Node{node8("a")}, Workload{Members: []int{1, 1}, CPUMilli: []int64{1}}},
		{"a negative memory request", []Node{node8("a")}, Workload{Members: []int{1}, MemMiB: []int64{-1}}},
		{"a node with negative CPU free", []Node{room(node8("a"), -1)}, Workload{Members: []int{1}}},
		{"a pod off the node", []Node{node8("a", pods("p", true, 8))}, Workload{Members: []int{1}}},
		{"a clique off the node", []Node{{Name: "a", GPUs: 2, Cliques: [][]int{{0, 2}}}}, Workload{Members: []int{1}}},
		{"negative unknown", []Node{{Name: "a", GPUs: 2, Unknown: -1}}, Workload{Members: []int{1}}},
	} {
		if _, err := Decide(tc.nodes, tc.w, 1, nil); err == nil || errors.Is(err, ErrNoPlan) || errors.Is(err, ErrFits) {
			t.Errorf("%s: err %v, want a validation error", tc.name, err)
		}
	}
}
