package queue

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tessera-gpu/tessera/allocator/quota"
)

func TestFairShare(t *testing.T) {
	tests := []struct {
		name     string
		specs    []Spec
		capacity int64
		used     map[string]int64
		pending  map[string]int64
		want     map[string]int64
	}{
		{
			name:     "guarantees first, then the rest by weight, the odd unit by name",
			specs:    []Spec{q("a", "", 2), q("b", "", 2).weigh(3)},
			capacity: 10,
			pending:  map[string]int64{"a": 10, "b": 10},
			// 2 + 2, then 6 split 1:3 = 1.5 and 4.5: equal remainders,
			// the unit goes to a.
			want: map[string]int64{"a": 4, "b": 6},
		},
		{
			name:     "a limit caps, and what it leaves goes round again",
			specs:    []Spec{q("a", "", 0).limit(3), q("b", "", 0), q("c", "", 0)},
			capacity: 12,
			pending:  map[string]int64{"a": 12, "b": 12, "c": 12},
			want:     map[string]int64{"a": 3, "b": 5, "c": 4},
		},
		{
			// kubectl-tessera.md's research department: vision is limited
			// to 4 and asks for 6, nlp asks for nothing; the department's
			// share is what its teams can take, 4, not 6.
			name:     "a parent's demand counts its children's up to their limits",
			specs:    []Spec{q("research", "", 0), q("vision", "research", 0).limit(4), q("nlp", "research", 0), q("other", "", 0)},
			capacity: 16,
			pending:  map[string]int64{"vision": 6, "other": 20},
			want:     map[string]int64{"research": 4, "vision": 4, "nlp": 0, "other": 12},
		},
		{
			name:     "demand caps",
			specs:    []Spec{q("a", "", 4), q("b", "", 4)},
			capacity: 16,
			used:     map[string]int64{"a": 1},
			pending:  map[string]int64{"b": 20},
			want:     map[string]int64{"a": 1, "b": 15},
		},
		{
			name:     "remainders by name",
			specs:    []Spec{q("c", "", 0), q("b", "", 0), q("a", "", 0)},
			capacity: 10,
			pending:  map[string]int64{"a": 10, "b": 10, "c": 10},
			want:     map[string]int64{"a": 4, "b": 3, "c": 3},
		},
		{
			name:     "larger remainder before name",
			specs:    []Spec{q("a", "", 0), q("b", "", 0).weigh(2)},
			capacity: 4,
			pending:  map[string]int64{"a": 10, "b": 10},
			// 4/3 and 8/3: b's remainder 2/3 beats a's 1/3.
			want: map[string]int64{"a": 1, "b": 3},
		},
		{
			name:     "weight 0 gets its guarantee and nothing more",
			specs:    []Spec{q("a", "", 2).weigh(0), q("b", "", 2)},
			capacity: 10,
			pending:  map[string]int64{"a": 10, "b": 10},
			want:     map[string]int64{"a": 2, "b": 8},
		},
		{
			name:     "capacity below the guarantees: split in proportion to them",
			specs:    []Spec{q("a", "", 6), q("b", "", 2)},
			capacity: 4,
			pending:  map[string]int64{"a": 10, "b": 10},
			want:     map[string]int64{"a": 3, "b": 1},
		},
		{
			name: "two levels: a department lends what its teams do not ask for",
			specs: []Spec{
				q("dept-a", "", 8), q("dept-b", "", 8),
				q("a1", "dept-a", 4), q("a2", "dept-a", 4),
				q("b1", "dept-b", 4), q("b2", "dept-b", 4),
			},
			capacity: 16,
			used:     map[string]int64{"a1": 6, "b1": 1},
			pending:  map[string]int64{"a1": 10, "a2": 2},
			// dept-b asks 1: dept-a gets its 8 and the 7 left (demand
			// 18); within it a2 gets its 2, a1 the rest.
			want: map[string]int64{"dept-a": 15, "dept-b": 1, "a1": 13, "a2": 2, "b1": 1, "b2": 0},
		},
		{
			name:     "an invalid queue's pending does not count, its used does",
			specs:    []Spec{q("a", "", 4).limit(2), q("b", "", 0)},
			capacity: 10,
			used:     map[string]int64{"a": 3},
			pending:  map[string]int64{"a": 5, "b": 20},
			want:     map[string]int64{"a": 2, "b": 8},
		},
		{
			name:     "nothing asked, nothing shared",
			specs:    []Spec{q("a", "", 4), q("b", "", 0)},
			capacity: 10,
			want:     map[string]int64{"a": 0, "b": 0},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := state(Build(tc.specs), tc.used, tc.pending)
			s.Capacity = gpus(tc.capacity)
			got := map[string]int64{}
			for name, r := range s.FairShare() {
				got[name] = r[gpu]
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("FairShare (-want +got):\n%s", diff)
			}
		})
	}
}

// Fair shares of siblings never add up to more than their parent's, and
// the top level's never to more than capacity.
func TestFairShareFitsItsParent(t *testing.T) {
	tree := departments()
	for cap := int64(0); cap <= 20; cap++ {
		for a1 := int64(0); a1 <= 12; a1 += 3 {
			s := state(tree, map[string]int64{"a1": a1, "b2": 3}, map[string]int64{"a2": 5, "b1": 7, "b2": 1})
			s.Capacity = gpus(cap)
			fair := s.FairShare()
			for _, parent := range append([]string{""}, tree.Names()...) {
				kids := tree.Children(parent)
				if len(kids) == 0 {
					continue
				}
				var sum int64
				for _, c := range kids {
					sum += fair[c][gpu]
				}
				limit := cap
				if parent != "" {
					limit = fair[parent][gpu]
				}
				if sum > limit {
					t.Errorf("capacity %d, a1 %d: children of %q share %d, above %d", cap, a1, parent, sum, limit)
				}
			}
		}
	}
}

func TestFairShareSeveralResources(t *testing.T) {
	spec := Spec{Name: "a", Guaranteed: quota.Resources{gpu: 1, mem: 100}}
	s := &State{
		Tree:     Build([]Spec{spec, {Name: "b"}}),
		Capacity: quota.Resources{gpu: 4, mem: 1000},
		Pending:  map[string]quota.Resources{"a": {gpu: 4, mem: 300}, "b": {gpu: 4, mem: 900}},
	}
	// GPUs: a's 1, then 3 split evenly, the odd one to a. Memory: a's
	// 100, then 900 split evenly, a capped at its 300.
	want := map[string]quota.Resources{
		"a": {gpu: 3, mem: 300},
		"b": {gpu: 1, mem: 700},
	}
	if diff := cmp.Diff(want, s.FairShare()); diff != "" {
		t.Errorf("FairShare (-want +got):\n%s", diff)
	}
}

func TestWaterfillHugeNumbers(t *testing.T) {
	const big = 1 << 62
	got := waterfill(big, []int64{big, big}, []int64{big, big}, []string{"a", "b"})
	if got[0]+got[1] != big || got[0] != big/2 {
		t.Errorf("waterfill = %v, want halves of %d", got, int64(big))
	}
}

// Time-based fair share: recent use beyond a queue's guarantee tilts its
// part of what is lent (k = HistoryWeight, half-life 1h; "recent" is the
// average use lately, Usage over the half-life's steady state).
func TestFairShareByHistory(t *testing.T) {
	const halfLife = time.Hour
	recent := func(n float64) Usage { return Usage{gpu: n * steadyState(halfLife)} }
	tests := []struct {
		name     string
		specs    []Spec
		k        float64
		halfLife time.Duration
		used     map[string]int64
		pending  map[string]int64
		recent   map[string]float64
		want     map[string]int64
	}{
		{
			// a borrowed 8 of 16 lately (u = 1/2, its weight's half):
			// weights 1/2 + (1/2 − 1/2) and 1/2 + 1/2, so a gets 16/3.
			name:    "a queue that borrowed lately gets less of what is lent",
			specs:   []Spec{q("a", "", 0), q("b", "", 0)},
			k:       1,
			pending: map[string]int64{"a": 16, "b": 16},
			recent:  map[string]float64{"a": 8},
			want:    map[string]int64{"a": 5, "b": 11},
		},
		{
			name:    "without a history weight history changes nothing",
			specs:   []Spec{q("a", "", 0), q("b", "", 0)},
			pending: map[string]int64{"a": 16, "b": 16},
			recent:  map[string]float64{"a": 8},
			want:    map[string]int64{"a": 8, "b": 8},
		},
		{
			name:     "without a half-life history is a plain sum and tilts nothing",
			specs:    []Spec{q("a", "", 0), q("b", "", 0)},
			k:        1,
			halfLife: -1,
			pending:  map[string]int64{"a": 16, "b": 16},
			recent:   map[string]float64{"a": 8},
			want:     map[string]int64{"a": 8, "b": 8},
		},
		{
			name:    "borrowing in proportion to the weights keeps them",
			specs:   []Spec{q("a", "", 0), q("b", "", 0).weigh(3)},
			k:       1,
			pending: map[string]int64{"a": 16, "b": 16},
			recent:  map[string]float64{"a": 4, "b": 12},
			want:    map[string]int64{"a": 4, "b": 12},
		},
		{
			name:    "use within the guarantee does not count",
			specs:   []Spec{q("a", "", 4), q("b", "", 4)},
			k:       1,
			pending: map[string]int64{"a": 16, "b": 16},
			recent:  map[string]float64{"a": 4},
			want:    map[string]int64{"a": 8, "b": 8},
		},
		{
			name:    "a larger k tilts more",
			specs:   []Spec{q("a", "", 0), q("b", "", 0)},
			k:       2,
			pending: map[string]int64{"a": 16, "b": 16},
			recent:  map[string]float64{"a": 4},
			// u 1/4: weights 1/2 + 2·(1/4) = 1 and 1/2 + 2·(1/2) = 3/2.
			want: map[string]int64{"a": 6, "b": 10},
		},
		{
			// a took all 16 lately: its weight tilts to 0 and b gets
			// first pick, but b asks for 4, and the 12 left go by the
			// plain weights to a, not to nobody.
			name:    "what the tilted weights cannot place goes by the plain weights",
			specs:   []Spec{q("a", "", 0), q("b", "", 0)},
			k:       1,
			pending: map[string]int64{"a": 16, "b": 4},
			recent:  map[string]float64{"a": 16},
			want:    map[string]int64{"a": 12, "b": 4},
		},
		{
			name:    "a monopolist gets nothing lent while the other wants it all",
			specs:   []Spec{q("a", "", 2), q("b", "", 2)},
			k:       1,
			pending: map[string]int64{"a": 16, "b": 16},
			recent:  map[string]float64{"a": 14},
			want:    map[string]int64{"a": 2, "b": 14},
		},
		{
			// dept-x borrowed 8 of 16 (its teams' sum): 16/3 to it, 5;
			// within it x1 borrowed 8 of those 5, tilted to 0, and x2,
			// without history, gets them.
			name: "each level tilts by its own children's history",
			specs: []Spec{
				q("dept-x", "", 0), q("dept-y", "", 0),
				q("x1", "dept-x", 0), q("x2", "dept-x", 0), q("y1", "dept-y", 0),
			},
			k:       1,
			pending: map[string]int64{"x1": 16, "x2": 16, "y1": 16},
			recent:  map[string]float64{"x1": 8},
			want:    map[string]int64{"dept-x": 5, "dept-y": 11, "x1": 0, "x2": 5, "y1": 11},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := state(Build(tc.specs), tc.used, tc.pending)
			s.HistoryWeight = tc.k
			s.HalfLife = halfLife
			if tc.halfLife != 0 {
				s.HalfLife = tc.halfLife
			}
			s.Usage = map[string]Usage{}
			for name, n := range tc.recent {
				s.Usage[name] = recent(n)
			}
			got := map[string]int64{}
			for name, r := range s.FairShare() {
				got[name] = r[gpu]
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("FairShare (-want +got):\n%s", diff)
			}
		})
	}
}

// Two backlogged queues of equal weight, a having used the whole cluster
// for a long while: with each queue given its fair share, history and
// use follow each other to the weights' split (8 and 8), a's share only
// growing on the way, and over the time it takes b makes up part of what
// a had.
func TestFairShareByHistorySettles(t *testing.T) {
	const halfLife = time.Hour
	s := state(Build([]Spec{q("a", "", 0), q("b", "", 0)}), nil, map[string]int64{"a": 16, "b": 16})
	s.HalfLife, s.HistoryWeight = halfLife, DefaultHistoryWeight
	s.Usage = map[string]Usage{"a": {gpu: 16 * steadyState(halfLife)}}
	var last int64 = -1
	var got map[string]quota.Resources
	var area [2]float64
	for step := range 8 * 60 { // 8 half-lives in minutes
		got = s.FairShare()
		if a := got["a"][gpu]; a < last {
			t.Fatalf("minute %d: a's fair share went down from %d to %d", step, last, a)
		} else {
			last = a
		}
		area[0] += float64(got["a"][gpu])
		area[1] += float64(got["b"][gpu])
		for _, name := range []string{"a", "b"} {
			s.Usage[name] = Accrue(s.Usage[name], got[name], time.Minute, halfLife)
		}
	}
	if got["a"][gpu] != 8 || got["b"][gpu] != 8 {
		t.Errorf("after 8 half-lives the fair shares are %v, want 8 and 8", got)
	}
	if area[1] <= area[0] {
		t.Errorf("b got %.0f GPU-minutes, a %.0f: the queue without history should get more", area[1], area[0])
	}
}
