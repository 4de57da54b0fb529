package reserve

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

const h = time.Hour

func running(gpus int, remaining time.Duration) Occupant {
	return Occupant{GPUs: gpus, Remaining: Expect(remaining)}
}

func TestStart(t *testing.T) {
	tests := []struct {
		name string
		held []Node
		want Window
	}{
		{"empty nodes start now", []Node{{GPUs: 8}, {GPUs: 8}}, Window{Known: true}},
		{"the last node to drain", []Node{{GPUs: 8, Occupants: []Occupant{running(4, 2*h), running(2, 5*h)}}, {GPUs: 8, Occupants: []Occupant{running(8, 3*h)}}}, Window{Known: true, In: 5 * h}},
		{"preemptible backfill does not delay it", []Node{{GPUs: 8, Occupants: []Occupant{running(4, 2*h), {GPUs: 4, Preemptible: true}}}}, Window{Known: true, In: 2 * h}},
		{"backfill by estimate ends before it", []Node{{GPUs: 8, Occupants: []Occupant{running(4, 2*h), {GPUs: 4, Backfilled: true, Remaining: Expect(h)}}}}, Window{Known: true, In: 2 * h}},
		{"past its estimate counts as now", []Node{{GPUs: 8, Occupants: []Occupant{running(4, -h)}}}, Window{Known: true}},
		{"a pod without an estimate: unknown", []Node{{GPUs: 8, Occupants: []Occupant{running(4, h)}}, {GPUs: 8, Occupants: []Occupant{{GPUs: 1}}}}, Window{}},
	}
	for _, tc := range tests {
		if got := Start(tc.held); got != tc.want {
			t.Errorf("%s: Start = %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

func TestAdmit(t *testing.T) {
	in3h := Window{Known: true, In: 3 * h}
	tests := []struct {
		name   string
		policy Policy
		rt     Runtime
		w      Window
		want   Admission
	}{
		{"ends before the start", Policy{Estimates: true}, Expect(2 * h), in3h, Backfilled},
		{"ends exactly at the start", Policy{Estimates: true}, Expect(3 * h), in3h, Backfilled},
		{"ends after the start", Policy{Estimates: true}, Expect(4 * h), in3h, Refused},
		{"ends after, preemptible allowed", Policy{Estimates: true, Preemptible: true}, Expect(4 * h), in3h, AsPreemptible},
		{"no estimate", Policy{Estimates: true}, Runtime{}, in3h, Refused},
		{"no estimate, preemptible allowed", Policy{Estimates: true, Preemptible: true}, Runtime{}, in3h, AsPreemptible},
		{"the start is unknown", Policy{Estimates: true}, Expect(time.Minute), Window{}, Refused},
		{"estimates off", Policy{}, Expect(time.Minute), in3h, Refused},
		{"estimates off, preemptible", Policy{Preemptible: true}, Expect(time.Minute), in3h, AsPreemptible},
	}
	for _, tc := range tests {
		if got := tc.policy.Admit(tc.rt, tc.w); got != tc.want {
			t.Errorf("%s: Admit = %v, want %v", tc.name, got, tc.want)
		}
		// Before a start 3 h away, a new job is admitted the same.
		if got := tc.policy.AdmitNew(tc.rt, tc.w); got != tc.want {
			t.Errorf("%s: AdmitNew = %v, want %v", tc.name, got, tc.want)
		}
	}
	// A reservation that can start now admits no new preemptible job
	// (it would be evicted at once); Admit still classifies one started.
	now := Window{Known: true}
	pre := Policy{Estimates: true, Preemptible: true}
	for _, rt := range []Runtime{{}, Expect(time.Minute)} {
		if got := pre.AdmitNew(rt, now); got != Refused {
			t.Errorf("AdmitNew(%v) on a reservation starting now = %v, want refused", rt, got)
		}
		if got := pre.Admit(rt, now); got != AsPreemptible {
			t.Errorf("Admit(%v) on a reservation starting now = %v, want preemptible", rt, got)
		}
	}
	if got := pre.AdmitNew(Runtime{}, Window{}); got != AsPreemptible {
		t.Errorf("AdmitNew on an unknown start = %v, want preemptible", got)
	}
}

func TestVictimsWithBackfill(t *testing.T) {
	pre := Occupant{GPUs: 2, Preemptible: true}
	within := Occupant{GPUs: 2, Backfilled: true, Remaining: Expect(time.Minute)}
	overran := Occupant{GPUs: 2, Backfilled: true, Remaining: Expect(-time.Minute)}
	overranNotBackfilled := running(2, -time.Minute)
	tests := []struct {
		name   string
		held   []Node
		want   [][2]int
		wantOK bool
	}{
		{"only preemptible and overrun backfill: both evicted", []Node{{Occupants: []Occupant{pre}}, {Occupants: []Occupant{overran}}}, [][2]int{{0, 0}, {1, 0}}, true},
		{"backfill within its estimate: wait for it", []Node{{Occupants: []Occupant{pre}}, {Occupants: []Occupant{within}}}, nil, false},
		{"a pod started outside a reservation past its estimate: wait", []Node{{Occupants: []Occupant{overranNotBackfilled}}}, nil, false},
		{"nothing left", []Node{{}, {}}, nil, true},
	}
	for _, tc := range tests {
		got, ok := Victims(tc.held)
		if ok != tc.wantOK || !cmp.Equal(got, tc.want) {
			t.Errorf("%s: Victims = %v, %v; want %v, %v", tc.name, got, ok, tc.want, tc.wantOK)
		}
	}
}

func TestRankByEstimates(t *testing.T) {
	nodes := []Node{
		{Name: "a", GPUs: 8, Occupants: []Occupant{running(1, 10*h)}},               // 1 GPU to drain, 10h
		{Name: "b", GPUs: 8, Occupants: []Occupant{running(8, 2*h)}},                // 8 GPUs, 2h
		{Name: "c", GPUs: 8, Occupants: []Occupant{{GPUs: 1}}},                      // no estimate
		{Name: "d", GPUs: 8, Occupants: []Occupant{running(4, h), running(3, 3*h)}}, // 7 GPUs, 3h
	}
	if diff := cmp.Diff([]int{1, 3, 0, 2}, (Policy{Estimates: true}).Rank(nodes)); diff != "" {
		t.Errorf("with estimates: the node that drains first first, unknown last (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]int{0, 2, 3, 1}, (Policy{}).Rank(nodes)); diff != "" {
		t.Errorf("without: the fewest GPUs to drain first (-want +got):\n%s", diff)
	}
}

func TestPriority(t *testing.T) {
	p := Policy{ShortFirst: true}
	tests := []struct {
		name string
		w    Waiting
		want float64
	}{
		{"just arrived", Waiting{Runtime: Expect(h)}, 1},
		{"waited its run time", Waiting{Waited: h, Runtime: Expect(h)}, 2},
		{"a short job that waited as long", Waiting{Waited: h, Runtime: Expect(6 * time.Minute)}, 11},
		{"under a minute counts as one", Waiting{Waited: time.Minute, Runtime: Expect(time.Second)}, 2},
		{"undeclared: 30 days", Waiting{Waited: DefaultUndeclared}, 2},
		{"undeclared, 2h waited", Waiting{Waited: 2 * h}, float64(2*h+DefaultUndeclared) / float64(DefaultUndeclared)},
	}
	for _, tc := range tests {
		if got := p.Priority(tc.w); got != tc.want {
			t.Errorf("%s: Priority = %v, want %v", tc.name, got, tc.want)
		}
	}
	if got := (Policy{Undeclared: h}).Priority(Waiting{Waited: 2 * h}); got != 3 {
		t.Errorf("Undeclared 1h, waited 2h: Priority = %v, want 3", got)
	}
	if err := (Policy{MinGPUs: 1, Undeclared: -h}).Validate(); err == nil {
		t.Error("a negative Undeclared was accepted")
	}
}

func TestMayHold(t *testing.T) {
	for _, tc := range []struct {
		share         float64
		big, capacity int
		want          bool
	}{
		{0, 128, 128, true}, // no cap
		{0.5, 64, 128, true},
		{0.5, 65, 128, false},
		{0.25, 0, 128, true},
		{0.5, 8, 0, true},
	} {
		if got := (Policy{MaxShare: tc.share}).MayHold(tc.big, tc.capacity); got != tc.want {
			t.Errorf("MaxShare %v: MayHold(%d of %d) = %v, want %v", tc.share, tc.big, tc.capacity, got, tc.want)
		}
	}
	for _, bad := range []float64{-0.1, 1.5} {
		if err := (Policy{MinGPUs: 1, MaxShare: bad}).Validate(); err == nil {
			t.Errorf("MaxShare %v accepted", bad)
		}
	}
}
