package quota

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tessera-gpu/tessera/api"
)

func gpus(n int64) Resources { return Resources{api.ResourceGPU: n} }

// twoTeams is the cluster: A and B with min 16, max 32 on 32 GPUs.
func twoTeams(usedA, usedB int64) *State {
	return &State{
		Quotas: map[string]Quota{
			"a": {Namespace: "a", Min: gpus(16), Max: gpus(32)},
			"b": {Namespace: "b", Min: gpus(16), Max: gpus(32)},
		},
		Used:     map[string]Resources{"a": gpus(usedA), "b": gpus(usedB)},
		Capacity: gpus(32),
	}
}

// minState is a State of namespaces with the given mins (max the
// capacity) and uses.
func minState(min, used map[string]int64, capacity int64) *State {
	s := &State{Quotas: map[string]Quota{}, Used: map[string]Resources{}, Capacity: gpus(capacity)}
	for ns, m := range min {
		s.Quotas[ns] = Quota{Namespace: ns, Min: gpus(m), Max: gpus(capacity)}
		s.Used[ns] = gpus(used[ns])
	}
	return s
}

func TestAdmit(t *testing.T) {
	tests := []struct {
		name    string
		state   *State
		ns      string
		req     Resources
		want    Decision
		wantMsg string
	}{
		{name: "within min", state: twoTeams(0, 0), ns: "a", req: gpus(16), want: Decision{Allowed: true}},
		{name: "borrows the other's idle min", state: twoTeams(16, 0), ns: "a", req: gpus(16), want: Decision{Allowed: true, Borrowing: true},
			wantMsg: "a borrows above its min (tessera.dev/gpu=16)"},
		// make demo's explain read "borrows above its min ()".
		{name: "borrows without a min", state: &State{Quotas: map[string]Quota{"a": {Namespace: "a", Max: gpus(8)}, "b": {Namespace: "b", Min: gpus(16)}},
			Used: map[string]Resources{}, Capacity: gpus(32)}, ns: "a", req: gpus(4), want: Decision{Allowed: true, Borrowing: true}, wantMsg: "a borrows: it has no min"},
		{name: "above max", state: twoTeams(32, 0), ns: "a", req: gpus(8), wantMsg: "a would use 40 tessera.dev/gpu, above its max 32"},
		{name: "nothing left to lend", state: twoTeams(16, 16), ns: "a", req: gpus(8), wantMsg: "would use 40 of 32 lendable"},
		{name: "back to its min while the other borrows", state: twoTeams(32, 0), ns: "b", req: gpus(16), want: Decision{Allowed: true}},
		{name: "ungoverned namespace", state: twoTeams(32, 0), ns: "c", req: gpus(64), want: Decision{Allowed: true}},
		{
			name:  "resource without a min is borrowed",
			state: twoTeams(0, 0), ns: "a", req: Resources{api.ResourceGPUCore: 50},
			wantMsg: "would use 50 of 0 lendable",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.state.Admit(tc.ns, tc.req)
			if tc.wantMsg != "" && got.Allowed {
				if !strings.Contains(got.Reason, tc.wantMsg) {
					t.Errorf("Admit reason %q, want %q", got.Reason, tc.wantMsg)
				}
				tc.wantMsg = ""
			}
			if tc.wantMsg != "" {
				if got.Allowed || !strings.Contains(got.Reason, tc.wantMsg) {
					t.Fatalf("Admit = %+v, want refused with %q", got, tc.wantMsg)
				}
				return
			}
			got.Reason = ""
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Admit (-want +got):\n%s", diff)
			}
		})
	}
}

var t0 = time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)

func workload(ns, name string, prio int32, age time.Duration, n int64) Workload {
	return Workload{Namespace: ns, Name: name, Priority: prio, Created: t0.Add(-age), Uses: gpus(n), Pods: []string{name + "-0"}}
}

// freed is an enough func: the victims free at least n GPUs.
func freed(n int64) func([]Workload) bool {
	return func(v []Workload) bool {
		var sum int64
		for _, w := range v {
			sum += w.Uses[api.ResourceGPU]
		}
		return sum >= n
	}
}

func names(ws []Workload) []string {
	var out []string
	for _, w := range ws {
		out = append(out, w.Namespace+"/"+w.Name)
	}
	return out
}

func TestReclaim(t *testing.T) {
	tests := []struct {
		name    string
		state   *State
		ns      string
		req     Resources
		running []Workload
		want    []string
		wantErr string
	}{
		{
			name:    "A's borrowed gang goes, whole",
			state:   twoTeams(32, 0),
			ns:      "b",
			req:     gpus(16),
			running: []Workload{workload("a", "old", 0, time.Hour, 16), workload("a", "new", 0, time.Minute, 16)},
			want:    []string{"a/new"},
		},
		{
			name:    "lowest priority before newest",
			state:   twoTeams(32, 0),
			ns:      "b",
			req:     gpus(16),
			running: []Workload{workload("a", "old-low", -1, time.Hour, 16), workload("a", "new", 0, time.Minute, 16)},
			want:    []string{"a/old-low"},
		},
		{
			name:    "an elastic gang's extra member before a newer whole workload",
			state:   twoTeams(32, 0),
			ns:      "b",
			req:     gpus(8),
			running: []Workload{workload("a", "gang", 0, time.Hour, 16), extra(workload("a", "gang member 2", 0, 30*time.Minute, 8)), workload("a", "new", 0, time.Minute, 8)},
			want:    []string{"a/gang member 2"},
		},
		{
			name:    "a lower priority before an extra member",
			state:   twoTeams(32, 0),
			ns:      "b",
			req:     gpus(8),
			running: []Workload{extra(workload("a", "gang member 2", 0, 30*time.Minute, 8)), workload("a", "low", -1, time.Hour, 8)},
			want:    []string{"a/low"},
		},
		{
			name:    "several small workloads",
			state:   twoTeams(32, 0),
			ns:      "b",
			req:     gpus(8),
			running: []Workload{workload("a", "base", 0, time.Hour, 16), workload("a", "x", 0, 3*time.Minute, 4), workload("a", "y", 0, 2*time.Minute, 4), workload("a", "z", 0, time.Minute, 8)},
			want:    []string{"a/z"},
		},
		{
			name:    "never under the victim's own min (no flapping)",
			state:   twoTeams(24, 0),
			ns:      "b",
			req:     gpus(16),
			running: []Workload{workload("a", "big", 0, time.Hour, 16), workload("a", "small", 0, time.Minute, 8)},
			wantErr: "borrow too little",
		},
		{
			// A tenant with min 2 borrows 14 GPUs through one 16-GPU
			// gang; b (min 12) uses 4 and asks 4 within its min. Taking
			// the gang leaves a 2 short of its min, less than b's 8,
			// and the gang borrows more (14) than that.
			name:    "a workload mostly borrowed straddles its namespace's min for one further below its own",
			state:   minState(map[string]int64{"a": 2, "b": 12}, map[string]int64{"a": 16, "b": 4}, 20),
			ns:      "b",
			req:     gpus(4),
			running: []Workload{workload("a", "gang", 0, time.Hour, 16)},
			want:    []string{"a/gang"},
		},
		{
			// a (min 6) borrows 4 through one 10-GPU workload and would
			// be 6 short: it holds more within its min than it borrows.
			name:    "a workload that borrows no more than it leaves short is kept",
			state:   minState(map[string]int64{"a": 6, "b": 10}, map[string]int64{"a": 10, "b": 2}, 12),
			ns:      "b",
			req:     gpus(2),
			running: []Workload{workload("a", "w", 0, time.Hour, 10)},
			wantErr: "borrow too little",
		},
		{
			name:    "an elastic gang's extra member straddles its namespace's min",
			state:   minState(map[string]int64{"a": 6, "b": 8}, map[string]int64{"a": 8, "b": 4}, 12),
			ns:      "b",
			req:     gpus(4),
			running: []Workload{workload("a", "gang", 0, time.Hour, 4), extra(workload("a", "gang member 1", 0, time.Minute, 4))},
			want:    []string{"a/gang member 1"},
		},
		{
			name:    "victims that keep every min before one that straddles",
			state:   minState(map[string]int64{"a": 6, "b": 8, "c": 0}, map[string]int64{"a": 8, "b": 4, "c": 4}, 16),
			ns:      "b",
			req:     gpus(4),
			running: []Workload{extra(workload("a", "gang member 1", 0, time.Minute, 4)), workload("c", "w", 0, time.Hour, 4)},
			want:    []string{"c/w"},
		},
		{
			name:    "only up to min",
			state:   twoTeams(16, 16),
			ns:      "b",
			req:     gpus(8),
			running: []Workload{workload("a", "g", 0, time.Minute, 16)},
			wantErr: "above its min 16: only min is reclaimed",
		},
		{
			name:    "own namespace's work is not a victim",
			state:   twoTeams(16, 8),
			ns:      "b",
			req:     gpus(8),
			running: []Workload{workload("b", "mine", -5, time.Minute, 8)},
			wantErr: "borrow too little",
		},
		{
			name:    "ungoverned namespace asks",
			state:   twoTeams(32, 0),
			ns:      "c",
			req:     gpus(8),
			wantErr: "has no quota",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			victims, err := tc.state.Reclaim(tc.ns, tc.req, tc.running, freed(tc.req[api.ResourceGPU]))
			if tc.wantErr != "" {
				var re *ReclaimError
				if !errors.As(err, &re) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Reclaim = %v, %v; want a ReclaimError containing %q", names(victims), err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, names(victims)); diff != "" {
				t.Errorf("victims (-want +got):\n%s", diff)
			}
		})
	}
}

func extra(w Workload) Workload {
	w.Extra = true
	return w
}

func TestReclaimNeedsNothingWhenRoomExists(t *testing.T) {
	victims, err := twoTeams(16, 0).Reclaim("b", gpus(16), []Workload{workload("a", "g", 0, time.Minute, 16)}, func([]Workload) bool { return true })
	if err != nil || len(victims) != 0 {
		t.Fatalf("Reclaim = %v, %v; want no victims", names(victims), err)
	}
}

func TestCanPreempt(t *testing.T) {
	s := twoTeams(32, 0)
	tests := []struct {
		name string
		ns   string
		req  Resources
		w    Workload
		want bool
	}{
		{"borrowed work, preemptor within min", "b", gpus(16), workload("a", "g", 0, 0, 16), true},
		{"preemptor would exceed its min", "b", gpus(24), workload("a", "g", 0, 0, 16), false},
		{"victim would fall under its min", "b", gpus(16), workload("a", "g", 0, 0, 24), false},
		{"same namespace", "a", gpus(8), workload("a", "g", 0, 0, 16), true},
		{"ungoverned preemptor", "c", gpus(8), workload("a", "g", 0, 0, 16), false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, why := s.CanPreempt(tc.ns, tc.req, tc.w)
			if got != tc.want {
				t.Errorf("CanPreempt = %v (%s), want %v", got, why, tc.want)
			}
		})
	}
}

// AdmitsWithout is the quota side of preempting a namespace's own
// lower-priority work for a pod its quota refuses: the refusal is
// resolved once enough of the namespace's use is gone. make demo's
// repro: eqp, min 8 = max 8, runs 8 one-GPU pods and a 4-GPU pod is
// refused until 4 of them are gone.
func TestAdmitsWithout(t *testing.T) {
	eqp := func(used, min, max int64) *State {
		return &State{
			Quotas: map[string]Quota{
				"eqp":   {Namespace: "eqp", Min: gpus(min), Max: gpus(max)},
				"other": {Namespace: "other", Min: gpus(8), Max: gpus(16)},
			},
			Used:     map[string]Resources{"eqp": gpus(used), "other": gpus(8)},
			Capacity: gpus(16),
		}
	}
	ones := func(ns string, n int) []Workload {
		var out []Workload
		for i := range n {
			out = append(out, workload(ns, fmt.Sprintf("lo-%d", i), 100, 0, 1))
		}
		return out
	}
	invalid := eqp(8, 8, 8)
	invalid.Quotas["eqp"] = Quota{Namespace: "eqp", Min: gpus(8), Max: gpus(8), Invalid: "min above max"}
	tests := []struct {
		name  string
		state *State
		ns    string
		req   Resources
		gone  []Workload
		want  bool
	}{
		{name: "at its max, nothing gone: refused", state: eqp(8, 8, 8), ns: "eqp", req: gpus(4), want: false},
		{name: "at its max, 3 of its own gone: still above", state: eqp(8, 8, 8), ns: "eqp", req: gpus(4), gone: ones("eqp", 3), want: false},
		{name: "at its max, 4 of its own gone: admitted", state: eqp(8, 8, 8), ns: "eqp", req: gpus(4), gone: ones("eqp", 4), want: true},
		{name: "another namespace's work does not bring it within its max", state: eqp(8, 8, 8), ns: "eqp", req: gpus(4), gone: ones("other", 8), want: false},
		{name: "ungoverned work counts against nothing", state: eqp(8, 8, 8), ns: "eqp", req: gpus(4), gone: ones("free", 8), want: false},
		// eqp min 4, max 16 uses 8 and other 8 of 16: borrowing 4 more is
		// beyond what can be lent until 4 of eqp's are gone.
		{name: "borrowing beyond what can be lent, resolved by its own", state: eqp(8, 4, 16), ns: "eqp", req: gpus(4), gone: ones("eqp", 4), want: true},
		{name: "an invalid quota admits nothing, whatever is gone", state: invalid, ns: "eqp", req: gpus(4), gone: ones("eqp", 8), want: false},
		{name: "an ungoverned namespace is admitted", state: eqp(8, 8, 8), ns: "free", req: gpus(64), want: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := tc.state.Clone()
			if got := tc.state.AdmitsWithout(tc.ns, tc.req, tc.gone); got != tc.want {
				t.Errorf("AdmitsWithout = %v, want %v", got, tc.want)
			}
			if diff := cmp.Diff(before, tc.state); diff != "" {
				t.Errorf("AdmitsWithout changed the state (-before +after):\n%s", diff)
			}
		})
	}
}

func TestReports(t *testing.T) {
	got := twoTeams(24, 4).Reports()
	want := []Report{
		{Namespace: "a", Used: gpus(24), Borrowed: gpus(8), Lent: Resources{}},
		{Namespace: "b", Used: gpus(4), Borrowed: Resources{}, Lent: gpus(12)},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Reports (-want +got):\n%s", diff)
	}
}

func TestCloneIsDeep(t *testing.T) {
	s := twoTeams(8, 0)
	c := s.Clone()
	c.Used["a"][api.ResourceGPU] = 30
	c.Quotas["a"].Min[api.ResourceGPU] = 0
	if s.Used["a"][api.ResourceGPU] != 8 || s.Quotas["a"].Min[api.ResourceGPU] != 16 {
		t.Errorf("Clone shares maps with the original: %+v", s)
	}
	// An invalid quota stays invalid in the copy: the filter's "would
	// preemption resolve it" asked a clone, which admitted the namespace.
	s.Quotas["b"] = Quota{Namespace: "b", Min: gpus(8), Max: gpus(4), Invalid: "min above max"}
	if got := s.Clone().Quotas["b"].Invalid; got != "min above max" {
		t.Errorf("Clone's Invalid = %q, want the original's", got)
	}
}

// Reclaim is topology-aware: the asker's enough says where its freed room
// must be (here, as on make demo's cluster, a gang that must share one
// node: 8 GPUs of one node). Namespace a (min 8) runs 28 one-GPU pods over
// four nodes (8, 8, 4 and 8 GPUs), the newest interleaved across them; b
// (min 16) asks for 8. Taking the newest until a node is free would spend
// a's 20 GPUs of surplus on all four nodes and free none ("borrow too
// little"); the victims are the 8 pods of one node, nothing else.
func TestReclaimFreesTheDomainTheAskerNeeds(t *testing.T) {
	s := twoTeams(28, 0)
	s.Quotas["a"] = Quota{Namespace: "a", Min: gpus(8), Max: gpus(28)}
	sizes := map[string]int{"n0": 8, "n1": 8, "n2": 4, "n3": 8}
	nodeOf := map[string]string{}
	var running []Workload
	age := time.Duration(0)
	for i := 0; i < 8; i++ {
		for _, n := range []string{"n0", "n1", "n2", "n3"} {
			if i >= sizes[n] {
				continue
			}
			age += time.Second // the first listed is the newest
			name := fmt.Sprintf("%s-%d", n, i)
			nodeOf[name] = n
			running = append(running, workload("a", name, 0, age, 1))
		}
	}
	oneNodeFree := func(v []Workload) bool {
		gone := map[string]int{}
		for _, w := range v {
			gone[nodeOf[w.Name]]++
		}
		for n, c := range gone {
			if c == sizes[n] && sizes[n] >= 8 {
				return true
			}
		}
		return false
	}
	victims, err := s.Reclaim("b", gpus(8), running, oneNodeFree)
	if err != nil {
		t.Fatal(err)
	}
	on := map[string]bool{}
	for _, w := range victims {
		on[nodeOf[w.Name]] = true
	}
	if len(victims) != 8 || len(on) != 1 {
		t.Errorf("victims %v, want the 8 pods of one 8-GPU node", names(victims))
	}
}
