package preempt

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

var t0 = time.Date(2026, 11, 24, 0, 0, 0, 0, time.UTC)

func unit(key string, prio int32, startedMin int, pods int) Unit {
	return Unit{Key: key, Priority: prio, Started: t0.Add(time.Duration(startedMin) * time.Minute), Pods: pods}
}

// gpus is a toy fit: each unit frees the GPUs given; the asker needs need
// GPUs on the node beyond free.
type gpus struct {
	free  map[string]int
	frees map[string]int // unit key -> GPUs it frees
	need  int
	calls int
}

func (g *gpus) fits(node string, victims []Unit) bool {
	g.calls++
	n := g.free[node]
	for _, v := range victims {
		n += g.frees[v.Key]
	}
	return n >= g.need
}

func keys(us []Unit) []string {
	out := []string{}
	for _, u := range us {
		out = append(out, u.Key)
	}
	return out
}

func TestChoose(t *testing.T) {
	tests := []struct {
		name     string
		cands    []Candidate
		g        gpus
		wantNode string
		want     []string
		wantOK   bool
	}{
		{
			name:  "lowest priority first, then the reprieve drops what is not needed",
			cands: []Candidate{{Node: "n1", Units: []Unit{unit("nb-small", 1000, 0, 1), unit("nb-big", 1000, 1, 1), unit("train", 10000, 0, 1)}}},
			// newest first among equal priority: nb-big (frees 2) then
			// nb-small (1): nb-big alone is enough.
			g:        gpus{free: map[string]int{}, frees: map[string]int{"nb-small": 1, "nb-big": 2, "train": 4}, need: 2},
			wantNode: "n1", want: []string{"nb-big"}, wantOK: true,
		},
		{
			name:  "a prefix that overshoots is trimmed to the minimum",
			cands: []Candidate{{Node: "n1", Units: []Unit{unit("a", 1, 3, 1), unit("b", 1, 2, 1), unit("c", 2, 0, 1)}}},
			// a (0) and b (0) free nothing usable; c frees 1: only c.
			g:        gpus{free: map[string]int{}, frees: map[string]int{"c": 1}, need: 1},
			wantNode: "n1", want: []string{"c"}, wantOK: true,
		},
		{
			name: "the node whose victims matter least wins",
			cands: []Candidate{
				{Node: "n1", Units: []Unit{unit("train", 10000, 0, 1)}},
				{Node: "n2", Units: []Unit{unit("nb", 1000, 0, 1)}},
			},
			g:        gpus{free: map[string]int{}, frees: map[string]int{"train": 1, "nb": 1}, need: 1},
			wantNode: "n2", want: []string{"nb"}, wantOK: true,
		},
		{
			name: "at equal priority, the fewest pods ended (a gang costs all its pods)",
			cands: []Candidate{
				{Node: "n1", Units: []Unit{unit("gang", 1000, 0, 4)}},
				{Node: "n2", Units: []Unit{unit("p1", 1000, 0, 1), unit("p2", 1000, 1, 1)}},
			},
			g:        gpus{free: map[string]int{}, frees: map[string]int{"gang": 2, "p1": 1, "p2": 1}, need: 2},
			wantNode: "n2", want: []string{"p2", "p1"}, wantOK: true,
		},
		{
			name:  "no room even with every unit gone: no preemption",
			cands: []Candidate{{Node: "n1", Units: []Unit{unit("a", 1, 0, 1)}}},
			g:     gpus{free: map[string]int{}, frees: map[string]int{"a": 1}, need: 2},
		},
		{
			name:  "fits without victims: nothing to preempt",
			cands: []Candidate{{Node: "n1", Units: []Unit{unit("a", 1, 0, 1)}}},
			g:     gpus{free: map[string]int{"n1": 1}, frees: map[string]int{"a": 1}, need: 1},
			// the greedy prefix always takes at least one unit, and the
			// reprieve keeps one: the caller checks the no-victim fit first.
			wantNode: "n1", want: []string{"a"}, wantOK: true,
		},
		{
			name:  "no candidates",
			cands: []Candidate{{Node: "n1"}},
			g:     gpus{free: map[string]int{}, need: 1},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := Choose(tc.cands, tc.g.fits)
			if ok != tc.wantOK {
				t.Fatalf("ok = %v, want %v (choice %+v)", ok, tc.wantOK, got)
			}
			if !ok {
				return
			}
			if got.Node != tc.wantNode {
				t.Errorf("node %s, want %s", got.Node, tc.wantNode)
			}
			if diff := cmp.Diff(tc.want, keys(got.Victims)); diff != "" {
				t.Errorf("victims (-want +got):\n%s", diff)
			}
		})
	}
}

// The fit is asked at most 3n+1 times per node: one look with every unit
// gone, the greedy prefix, the reprieve, the single units.
func TestChooseCalls(t *testing.T) {
	var units []Unit
	frees := map[string]int{}
	for i := range 20 {
		k := string(rune('a' + i))
		units = append(units, unit(k, int32(i), 0, 1))
		frees[k] = 1
	}
	g := &gpus{free: map[string]int{}, frees: frees, need: 20}
	if _, ok := Choose([]Candidate{{Node: "n", Units: units}}, g.fits); !ok {
		t.Fatal("no choice")
	}
	if g.calls > 3*len(units)+1 {
		t.Errorf("%d fit calls for %d units", g.calls, len(units))
	}
}

// a and b share a GPU: only both gone free it; c frees another alone. The
// greedy order takes a and b; the single unit c costs less.
func TestChooseSingleBeatsGreedyPair(t *testing.T) {
	fits := func(_ string, victims []Unit) bool {
		has := map[string]bool{}
		for _, v := range victims {
			has[v.Key] = true
		}
		return has["c"] || has["a"] && has["b"]
	}
	got, ok := Choose([]Candidate{{Node: "n1", Units: []Unit{unit("a", 1, 0, 1), unit("b", 1, 0, 1), unit("c", 1, 0, 1)}}}, fits)
	if !ok {
		t.Fatal("no choice")
	}
	if diff := cmp.Diff([]string{"c"}, keys(got.Victims)); diff != "" {
		t.Errorf("victims (-want +got):\n%s", diff)
	}
}

// aboveMax is a toy fit for a pod above its namespace's ElasticQuota max:
// units are "node/name", one GPU each, all of the asker's namespace; the
// asker needs need GPUs on the node (free there, plus its units gone) and
// at least over units gone anywhere (its namespace back within its max).
type aboveMax struct {
	free       map[string]int
	need, over int
}

func (a aboveMax) fits(node string, victims []Unit) bool {
	room := a.free[node]
	for _, v := range victims {
		if n, _, _ := strings.Cut(v.Key, "/"); n == node {
			room++
		}
	}
	return room >= a.need && len(victims) >= a.over
}

// candidates offers on each node its own units and every other unit
// Elsewhere, as the extender does for a pod above its max.
func candidates(units []Unit) []Candidate {
	var nodes []string
	seen := map[string]bool{}
	for _, u := range units {
		if n, _, _ := strings.Cut(u.Key, "/"); !seen[n] {
			seen[n] = true
			nodes = append(nodes, n)
		}
	}
	var out []Candidate
	for _, n := range nodes {
		c := Candidate{Node: n}
		for _, u := range units {
			u.Elsewhere = !strings.HasPrefix(u.Key, n+"/")
			c.Units = append(c.Units, u)
		}
		out = append(out, c)
	}
	return out
}

// A pod above its namespace's max needs victims for quota wherever they
// run, and room on its node: the fewest, least important of its
// namespace's units that do both, the node's own first at one priority.
func TestChooseWithUnitsElsewhere(t *testing.T) {
	// n units of node, one GPU each, started from minutes on (the last
	// the newest).
	ones := func(node string, prio int32, n, from int) []Unit {
		var out []Unit
		for i := range n {
			out = append(out, unit(node+"/"+string(rune('a'+i)), prio, from+i, 1))
		}
		return out
	}
	tests := []struct {
		name     string
		units    []Unit
		fit      aboveMax
		wantNode string
		want     []string
		wantOK   bool
	}{
		{
			// make demo: 6 low pods on a100-1 (2 GPUs free), 2 on a100-2
			// (6 free), those the newest; the 4-GPU pod fits a100-2 as it
			// is, but quota needs 4 gone: 4 on a100-1, where they make its
			// room, beat the newest 2 and 2 of a100-1 for a100-1 as for
			// a100-2 (the same cost but for the units elsewhere).
			name:     "the repro: four of the node where they make room",
			units:    append(ones("a100-1", 100, 6, 0), ones("a100-2", 100, 2, 10)...),
			fit:      aboveMax{free: map[string]int{"a100-1": 2, "a100-2": 6}, need: 4, over: 4},
			wantNode: "a100-1", want: []string{"a100-1/f", "a100-1/e", "a100-1/d", "a100-1/c"}, wantOK: true,
		},
		{
			name:     "too few on any one node: the rest elsewhere, the newest",
			units:    append(ones("n1", 100, 3, 0), ones("n2", 100, 3, 10)...),
			fit:      aboveMax{free: map[string]int{"n1": 5, "n2": 5}, need: 4, over: 4},
			wantNode: "n1", want: []string{"n1/c", "n1/b", "n1/a", "n2/c"}, wantOK: true,
		},
		{
			name:     "the fewest units elsewhere beats the node name",
			units:    append(ones("n1", 100, 2, 10), ones("n2", 100, 6, 0)...),
			fit:      aboveMax{free: map[string]int{"n1": 6, "n2": 2}, need: 4, over: 4},
			wantNode: "n2", want: []string{"n2/f", "n2/e", "n2/d", "n2/c"}, wantOK: true,
		},
		{
			name:     "a lower priority elsewhere goes before the node's own",
			units:    append(ones("n1", 100, 4, 0), ones("n2", 50, 1, 0)...),
			fit:      aboveMax{free: map[string]int{"n1": 2}, need: 4, over: 3},
			wantNode: "n1", want: []string{"n2/a", "n1/d", "n1/c"}, wantOK: true,
		},
		{
			name:  "not enough of its own anywhere: no preemption",
			units: append(ones("n1", 100, 2, 0), ones("n2", 100, 1, 0)...),
			fit:   aboveMax{free: map[string]int{"n1": 8, "n2": 8}, need: 4, over: 4},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := Choose(candidates(tc.units), tc.fit.fits)
			if ok != tc.wantOK {
				t.Fatalf("ok = %v, want %v (choice %+v)", ok, tc.wantOK, got)
			}
			if !ok {
				return
			}
			if got.Node != tc.wantNode {
				t.Errorf("node %s, want %s", got.Node, tc.wantNode)
			}
			if diff := cmp.Diff(tc.want, keys(got.Victims)); diff != "" {
				t.Errorf("victims (-want +got):\n%s", diff)
			}
		})
	}
}
