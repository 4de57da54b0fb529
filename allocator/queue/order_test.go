package queue

import (
	"math"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tessera-gpu/tessera/allocator/quota"
)

const halfLife = 24 * time.Hour

// hours is the history of using n GPUs for d, decayed with halfLife.
func hours(n int64, d time.Duration) Usage {
	return Accrue(nil, gpus(n), d, halfLife)
}

func TestShare(t *testing.T) {
	tree := Build([]Spec{q("a", "", 4), q("b", "", 0), q("c", "", 4)})
	s := &State{
		Tree: tree, Capacity: gpus(16), HalfLife: halfLife,
		Used:    map[string]quota.Resources{"a": gpus(2), "b": gpus(3)},
		Pending: map[string]quota.Resources{"b": gpus(3)},
		Usage: map[string]Usage{
			// Its guarantee, forever, plus the 2 it uses now: 6/4.
			"a": {gpu: 4 * steadyState(halfLife)},
		},
	}
	tests := []struct {
		queue string
		want  float64
	}{
		{"a", 1.5},
		// No history: used over fair share (b's guarantee is 0; its
		// fair share is its demand, 6).
		{"b", 0.5},
		{"c", 0},
	}
	for _, tc := range tests {
		if got := s.Share(tc.queue); !close(got, tc.want, 1e-12) {
			t.Errorf("Share(%s) = %g, want %g", tc.queue, got, tc.want)
		}
	}
}

// The case (b): two teams with equal guarantees, one with usage
// history, both submit at once: the other goes first, even with the older
// workload on the team with history.
func TestHistoryOrdersSecond(t *testing.T) {
	s := state(Build([]Spec{q("team-a", "", 8), q("team-b", "", 8)}), nil, map[string]int64{"team-a": 8, "team-b": 8})
	s.HalfLife = halfLife
	s.Usage = map[string]Usage{"team-a": hours(8, 48*time.Hour), "team-b": hours(1, time.Hour)}
	ws := []Workload{wl("team-a", "old", 0, time.Hour, 8), wl("team-b", "new", 0, time.Minute, 8)}
	s.Order(ws)
	if diff := cmp.Diff([]string{"team-b/new", "team-a/old"}, keys(ws)); diff != "" {
		t.Errorf("Order (-want +got):\n%s", diff)
	}
	if !s.Less("team-b", "team-a") || s.Less("team-a", "team-b") {
		t.Errorf("Less: team-b should go before team-a (shares %g, %g)", s.Share("team-b"), s.Share("team-a"))
	}
	// History decays: two weeks later team-a's 48 hours weigh less than
	// team-b's hour.
	s.Usage["team-a"] = Decay(s.Usage["team-a"], 14*24*time.Hour, halfLife)
	if !s.Less("team-a", "team-b") {
		t.Errorf("after two weeks team-a should go first (shares %g, %g)", s.Share("team-a"), s.Share("team-b"))
	}
}

func TestOrder(t *testing.T) {
	tree := departments()
	s := state(tree, map[string]int64{"a1": 4}, nil)
	s.HalfLife = halfLife
	// dept-a has used more than dept-b, though a2 itself has no history.
	s.Usage = map[string]Usage{"a1": hours(8, 24*time.Hour), "b1": hours(2, time.Hour), "b2": hours(4, 24*time.Hour)}
	tests := []struct {
		name string
		ws   []Workload
		want []string
	}{
		{
			name: "priority beats share",
			ws:   []Workload{wl("b2", "low", 0, time.Hour, 1), wl("a1", "high", 100, 0, 1)},
			want: []string{"a1/high", "b2/low"},
		},
		{
			name: "the department with less history first, whatever its team's",
			ws:   []Workload{wl("a2", "x", 0, time.Hour, 1), wl("b2", "y", 0, 0, 1)},
			want: []string{"b2/y", "a2/x"},
		},
		{
			name: "within a department, the team with less history first",
			ws:   []Workload{wl("b2", "x", 0, time.Hour, 1), wl("b1", "y", 0, 0, 1)},
			want: []string{"b1/y", "b2/x"},
		},
		{
			name: "same queue: older first, then by key",
			ws:   []Workload{wl("a1", "c", 0, time.Minute, 1), wl("a1", "b", 0, time.Hour, 1), wl("a1", "a", 0, time.Minute, 1)},
			want: []string{"a1/b", "a1/a", "a1/c"},
		},
		{
			name: "unknown queues go last",
			ws:   []Workload{wl("nope", "x", 0, time.Hour, 1), wl("a1", "y", 0, 0, 1)},
			want: []string{"a1/y", "nope/x"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s.Order(tc.ws)
			if diff := cmp.Diff(tc.want, keys(tc.ws)); diff != "" {
				t.Errorf("Order (-want +got):\n%s", diff)
			}
		})
	}
}

func TestLessAlongThePath(t *testing.T) {
	s := state(departments(), map[string]int64{"a1": 8, "b1": 2}, nil)
	tests := []struct {
		a, b string
		want bool
	}{
		{"b2", "a2", true}, // dept-b 2/8 before dept-a 8/8
		{"a2", "b1", false},
		{"a2", "a1", true}, // siblings: 0/4 before 8/4
		{"a1", "dept-a", false},
		{"dept-a", "a1", false},
		{"a1", "a1", false},
	}
	for _, tc := range tests {
		if got := s.Less(tc.a, tc.b); got != tc.want {
			t.Errorf("Less(%s, %s) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
	}
}

func TestShareWithoutDecayCountsSeconds(t *testing.T) {
	s := &State{Tree: Build([]Spec{q("a", "", 2)}), Capacity: gpus(4), Usage: map[string]Usage{"a": Accrue(nil, gpus(2), time.Minute, 0)}}
	if got := s.Share("a"); got != 60 {
		t.Errorf("Share = %g, want 60 (seconds at the entitlement)", got)
	}
	if got := s.Share("nope"); got != 0 || math.IsNaN(got) {
		t.Errorf("Share(nope) = %g", got)
	}
}
