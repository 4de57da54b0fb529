package preempt

import (
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// cluster is a toy fit for a gang: members members of need GPUs each,
// each on any allowed node (several on one node when there is room), or
// all on one node when oneNode.
type cluster struct {
	size    map[string]int            // node -> GPUs
	used    map[string]map[string]int // node -> unit key -> GPUs it holds there
	allowed map[string]bool           // nil: every node
	members int
	need    int
	oneNode bool
	calls   int
}

func (c *cluster) fits(victims []Unit) bool {
	c.calls++
	gone := map[string]bool{}
	for _, v := range victims {
		gone[v.Key] = true
	}
	slots := 0
	for node, size := range c.size {
		if c.allowed != nil && !c.allowed[node] {
			continue
		}
		free := size
		for k, n := range c.used[node] {
			if !gone[k] {
				free -= n
			}
		}
		if c.oneNode && free >= c.members*c.need {
			return true
		}
		slots += free / c.need
	}
	return !c.oneNode && slots >= c.members
}

// fill puts n units of gpus GPUs each on node, named node-i, priority
// prio, started at startedMin(i) minutes.
func (c *cluster) fill(node string, n, gpus int, prio int32, startedMin func(i int) int) []Unit {
	if c.used == nil {
		c.used = map[string]map[string]int{}
	}
	if c.used[node] == nil {
		c.used[node] = map[string]int{}
	}
	var out []Unit
	for i := range n {
		k := fmt.Sprintf("%s-%d", node, i)
		c.used[node][k] = gpus
		out = append(out, unit(k, prio, startedMin(i), 1))
	}
	return out
}

func sortedKeys(us []Unit) []string {
	out := keys(us)
	sort.Strings(out)
	return out
}

func TestChooseAcross(t *testing.T) {
	tests := []struct {
		name   string
		build  func(c *cluster) []Unit
		c      cluster
		want   []string // sorted
		wantOK bool
	}{
		{
			name: "a 2 x 8 GPU gang on three full nodes: the notebooks of two nodes, none of the third",
			c:    cluster{size: map[string]int{"n1": 8, "n2": 8, "n3": 8}, members: 2, need: 8},
			build: func(c *cluster) []Unit {
				// Start times interleave the nodes, newest first: n3, n2,
				// n1, n3, ...: the greedy prefix takes notebooks on all
				// three nodes before two are empty; n1's go back.
				var us []Unit
				us = append(us, c.fill("n1", 8, 1, 1000, func(i int) int { return 3 * i })...)
				us = append(us, c.fill("n2", 8, 1, 1000, func(i int) int { return 3*i + 1 })...)
				us = append(us, c.fill("n3", 8, 1, 1000, func(i int) int { return 3*i + 2 })...)
				return us
			},
			want: []string{
				"n2-0", "n2-1", "n2-2", "n2-3", "n2-4", "n2-5", "n2-6", "n2-7",
				"n3-0", "n3-1", "n3-2", "n3-3", "n3-4", "n3-5", "n3-6", "n3-7",
			},
			wantOK: true,
		},
		{
			name: "a unit taken on a node that cannot serve the asker is given back",
			// far is the newest, so the greedy order takes it first, but
			// the asker may not run on its node.
			c: cluster{size: map[string]int{"n1": 2, "far": 2}, allowed: map[string]bool{"n1": true}, members: 1, need: 2},
			build: func(c *cluster) []Unit {
				us := c.fill("far", 1, 2, 1000, func(int) int { return 60 })
				return append(us, c.fill("n1", 2, 1, 1000, func(i int) int { return i })...)
			},
			want: []string{"n1-0", "n1-1"}, wantOK: true,
		},
		{
			name: "a gang that needs one node evicts only within one",
			c:    cluster{size: map[string]int{"a": 8, "b": 8}, members: 2, need: 4, oneNode: true},
			build: func(c *cluster) []Unit {
				// a: four free, four 1-GPU units; b: four 2-GPU units,
				// newer, interleaved with a's.
				us := c.fill("a", 4, 1, 1000, func(i int) int { return 2*i + 1 })
				return append(us, c.fill("b", 4, 2, 1000, func(i int) int { return 2*i + 2 })...)
			},
			want: []string{"b-0", "b-1", "b-2", "b-3"}, wantOK: true,
		},
		{
			name: "the extra members of an elastic gang go before any whole workload, newest first",
			c:    cluster{size: map[string]int{"n1": 4}, members: 1, need: 1},
			build: func(c *cluster) []Unit {
				us := c.fill("n1", 1, 1, 1000, func(int) int { return 50 }) // a whole notebook, newest
				c.used["n1"]["el member el-2"] = 1
				c.used["n1"]["el member el-3"] = 1
				c.used["n1"]["el-0"] = 1 // the gang's minimum: not a unit of its own
				return append(us,
					Unit{Key: "el member el-2", Priority: 10000, Started: t0.Add(10 * time.Minute), Pods: 1, Extra: true},
					Unit{Key: "el member el-3", Priority: 10000, Started: t0.Add(20 * time.Minute), Pods: 1, Extra: true},
				)
			},
			want: []string{"el member el-3"}, wantOK: true,
		},
		{
			name: "one unit that suffices beats the many newer ones the greedy order takes",
			c:    cluster{size: map[string]int{"n1": 8, "n2": 8}, members: 1, need: 8},
			build: func(c *cluster) []Unit {
				us := c.fill("n1", 8, 1, 1000, func(i int) int { return 10 + i })
				return append(us, c.fill("n2", 1, 8, 1000, func(int) int { return 0 })...)
			},
			want: []string{"n2-0"}, wantOK: true,
		},
		{
			name: "lower priority first, higher tiers stay",
			c:    cluster{size: map[string]int{"n1": 8, "n2": 8}, members: 1, need: 8},
			build: func(c *cluster) []Unit {
				us := c.fill("n1", 1, 8, 10000, func(int) int { return 30 })
				return append(us, c.fill("n2", 2, 4, 1000, func(i int) int { return i })...)
			},
			want: []string{"n2-0", "n2-1"}, wantOK: true,
		},
		{
			name:   "fits as it is: no victim",
			c:      cluster{size: map[string]int{"n1": 8}, members: 1, need: 4},
			build:  func(c *cluster) []Unit { return c.fill("n1", 4, 1, 1000, func(i int) int { return i }) },
			want:   []string{},
			wantOK: true,
		},
		{
			name:  "no room with every unit gone",
			c:     cluster{size: map[string]int{"n1": 8, "n2": 8}, members: 3, need: 8},
			build: func(c *cluster) []Unit { return c.fill("n1", 8, 1, 1000, func(i int) int { return i }) },
		},
		{
			name:  "no units",
			c:     cluster{size: map[string]int{"n1": 8}, used: map[string]map[string]int{"n1": {"pinned": 8}}, members: 1, need: 8},
			build: func(*cluster) []Unit { return nil },
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.c
			units := tc.build(&c)
			got, ok := ChooseAcross(units, c.fits)
			if ok != tc.wantOK {
				t.Fatalf("ok = %v, want %v (victims %v)", ok, tc.wantOK, keys(got))
			}
			if !ok {
				return
			}
			if diff := cmp.Diff(tc.want, sortedKeys(got)); diff != "" {
				t.Errorf("victims (-want +got):\n%s", diff)
			}
			if !c.fits(got) {
				t.Errorf("the asker does not fit without the victims %v", keys(got))
			}
			// Each victim is needed.
			for i := range got {
				rest := append(append([]Unit(nil), got[:i]...), got[i+1:]...)
				if len(got) > 1 && c.fits(rest) {
					t.Errorf("victim %s is not needed", got[i].Key)
				}
			}
		})
	}
}

// The fit is asked at most 3n+2 times for n units.
func TestChooseAcrossCalls(t *testing.T) {
	c := &cluster{size: map[string]int{"n1": 16, "n2": 16}, members: 2, need: 16}
	units := append(c.fill("n1", 16, 1, 1000, func(i int) int { return 2 * i }), c.fill("n2", 16, 1, 1000, func(i int) int { return 2*i + 1 })...)
	if _, ok := ChooseAcross(units, c.fits); !ok {
		t.Fatal("no choice")
	}
	if c.calls > 3*len(units)+2 {
		t.Errorf("%d fit calls for %d units", c.calls, len(units))
	}
}
