package reserve

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestDue(t *testing.T) {
	p := Policy{MinGPUs: 16, Wait: time.Hour, WaitPerGPU: time.Minute}
	tests := []struct {
		gpus   int
		waited time.Duration
		want   bool
	}{
		{8, 100 * time.Hour, false},               // too small, ever
		{16, time.Hour + 15*time.Minute, false},   // due after 1h16m
		{16, time.Hour + 16*time.Minute, true},    //
		{64, time.Hour + 63*time.Minute, false},   // due after 2h04m
		{64, 2*time.Hour + 4*time.Minute, true},   //
		{64, 200*time.Hour + 4*time.Minute, true}, //
	}
	for _, tc := range tests {
		if got := p.Due(tc.gpus, tc.waited, 0); got != tc.want {
			t.Errorf("Due(%d GPUs, waited %v) = %v, want %v", tc.gpus, tc.waited, got, tc.want)
		}
	}
}

func TestDueRelative(t *testing.T) {
	// Due when it has waited 2h longer than the oldest small job.
	p := Policy{MinGPUs: 16, Wait: 2 * time.Hour, Relative: 1}
	for _, tc := range []struct {
		waited, small time.Duration
		want          bool
	}{
		{3 * time.Hour, 0, true},
		{3 * time.Hour, 2 * time.Hour, false},
		{100 * time.Hour, 97 * time.Hour, true},
		{100 * time.Hour, 99 * time.Hour, false},
	} {
		if got := p.Due(16, tc.waited, tc.small); got != tc.want {
			t.Errorf("Due(waited %v, small waited %v) = %v, want %v", tc.waited, tc.small, got, tc.want)
		}
	}
	q := []Waiting{{GPUs: 1, Waited: 9 * time.Hour}, {GPUs: 32, Waited: 10 * time.Hour}, {GPUs: 4, Waited: 1 * time.Hour}, {GPUs: 16, Waited: 12 * time.Hour}}
	if got := p.SmallWaited(q); got != 9*time.Hour {
		t.Errorf("SmallWaited = %v, want 9h", got)
	}
	if diff := cmp.Diff([]int{3}, p.Heads(q)); diff != "" {
		t.Errorf("Heads (-want +got):\n%s", diff)
	}
}

func TestHeads(t *testing.T) {
	q := []Waiting{{GPUs: 1, Waited: 9 * time.Hour}, {GPUs: 32, Waited: time.Hour}, {GPUs: 16, Waited: 5 * time.Hour}, {GPUs: 64, Waited: 4 * time.Hour}}
	p := Policy{MinGPUs: 16, Wait: 2 * time.Hour}
	if diff := cmp.Diff([]int{2}, p.Heads(q)); diff != "" {
		t.Errorf("one slot (-want +got):\n%s", diff)
	}
	p.Max = 3
	if diff := cmp.Diff([]int{2, 3}, p.Heads(q)); diff != "" {
		t.Errorf("three slots (-want +got):\n%s", diff)
	}
}

func TestPick(t *testing.T) {
	occ := func(gpus int, age time.Duration, pre bool) Occupant {
		return Occupant{GPUs: gpus, Age: age * time.Hour, Preemptible: pre}
	}
	nodes := func() []Node {
		return []Node{
			{Name: "a", GPUs: 8, Occupants: []Occupant{occ(4, 10, false)}},
			{Name: "b", GPUs: 8, Occupants: []Occupant{occ(2, 1, false), occ(6, 1, true)}}, // 2 to drain
			{Name: "c", GPUs: 8, Occupants: []Occupant{occ(4, 1, false)}},
			{Name: "d", GPUs: 8, Occupants: []Occupant{occ(8, 1, false)}},
			{Name: "e", GPUs: 4},
		}
	}
	tests := []struct {
		name  string
		p     Policy
		edit  func([]Node)
		pods  []int
		taken map[int]bool
		want  []int
	}{
		// b has 2 GPUs to drain (its preemptible pods do not count);
		// a and c have 4: c's pod is younger. e is too small.
		{name: "fewest to drain, youngest", pods: []int{8, 8}, want: []int{1, 2}},
		{name: "oldest", p: Policy{Order: OrderOldest}, pods: []int{8, 8}, want: []int{0, 1}},
		{name: "held keeps a tie", pods: []int{8, 8}, edit: func(n []Node) { n[0].Held = true }, want: []int{0, 1}},
		{name: "by age", p: Policy{ByAge: true}, pods: []int{8, 8, 8}, want: []int{1, 2, 3}},
		{name: "small pod takes the small node", pods: []int{8, 4}, want: []int{1, 4}},
		{name: "taken by another reservation", pods: []int{8, 8}, taken: map[int]bool{1: true}, want: []int{0, 2}},
		{name: "too many pods", pods: []int{8, 8, 8, 8, 8}, want: nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n := nodes()
			if tc.edit != nil {
				tc.edit(n)
			}
			if diff := cmp.Diff(tc.want, tc.p.Pick(n, tc.pods, tc.taken)); diff != "" {
				t.Errorf("held nodes (-want +got):\n%s", diff)
			}
		})
	}
}

func TestVictims(t *testing.T) {
	held := []Node{
		{Name: "a", GPUs: 8, Occupants: []Occupant{{GPUs: 2, Preemptible: true}}},
		{Name: "b", GPUs: 8, Occupants: []Occupant{{GPUs: 1, Preemptible: true}, {GPUs: 3}}},
	}
	if v, ok := Victims(held); ok || v != nil {
		t.Errorf("Victims while b still drains = %v, %v; want none, false", v, ok)
	}
	held[1].Occupants = held[1].Occupants[:1]
	v, ok := Victims(held)
	if diff := cmp.Diff([][2]int{{0, 0}, {1, 0}}, v); !ok || diff != "" {
		t.Errorf("Victims once drained: ok %v (-want +got):\n%s", ok, diff)
	}
}

func TestValidate(t *testing.T) {
	for _, p := range []Policy{{}, {MinGPUs: 1, Wait: -1}, {MinGPUs: 1, Max: -1}, {MinGPUs: 1, Order: "soonest"}, {MinGPUs: 1, Relative: -1}} {
		if p.Validate() == nil {
			t.Errorf("%+v: accepted", p)
		}
	}
	if err := (Policy{MinGPUs: 16, Wait: time.Hour}).Validate(); err != nil {
		t.Error(err)
	}
}

func TestBacklogAndOverdue(t *testing.T) {
	p := Policy{MinGPUs: 16, Wait: time.Hour, Backlog: 0.5, Undeclared: 24 * time.Hour}
	ahead := []Work{
		{GPUs: 8, Remaining: Expect(10 * time.Hour)}, // 80 GPU-h
		{GPUs: 16, Remaining: Runtime{}},             // undeclared: 24 h, 384 GPU-h
		{GPUs: 8, Remaining: Expect(-2 * time.Hour)}, // past its estimate: 0
		{GPUs: 32, Remaining: Expect(3 * time.Hour)}, // 96 GPU-h
	}
	if got, want := p.BacklogWait(ahead, 32), time.Duration(float64(80+384+96)/32*float64(time.Hour)); got != want {
		t.Errorf("BacklogWait = %s, want %s", got, want)
	}
	if got := p.BacklogWait(ahead, 0); got != 0 {
		t.Errorf("BacklogWait on no GPUs = %s, want 0", got)
	}
	backlog := 10 * time.Hour
	if d, ok := p.DueAfterBacklog(16, 0, backlog); !ok || d != 6*time.Hour {
		t.Errorf("DueAfterBacklog = %s %v, want 6h (1h + 0.5 x 10h)", d, ok)
	}
	if p.DueBacklog(16, 5*time.Hour, 0, backlog) || !p.DueBacklog(16, 6*time.Hour, 0, backlog) {
		t.Error("DueBacklog: due before 6h, or not at 6h")
	}
	if over, ok := p.Overdue(16, 8*time.Hour, 0, backlog); !ok || over != 2*time.Hour {
		t.Errorf("Overdue = %s %v, want 2h", over, ok)
	}
	if _, ok := p.Overdue(16, 5*time.Hour, 0, backlog); ok {
		t.Error("Overdue before due")
	}
	if _, ok := p.Overdue(8, 100*time.Hour, 0, 0); ok {
		t.Error("Overdue for a job below MinGPUs")
	}
	if !p.Due(16, time.Hour, 0) {
		t.Error("Due without a backlog: want due at Wait")
	}
	if err := (Policy{MinGPUs: 1, Backlog: -1}).Validate(); err == nil {
		t.Error("a negative Backlog validated")
	}
}
