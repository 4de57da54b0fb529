package queue

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestPreemptOwn(t *testing.T) {
	// Two teams guaranteed 8 each fill 16 GPUs with 1-GPU low-tier
	// (100) pods; ty's 4-GPU pod of tier 1000 asks.
	lows := func(queue string, n int) []Workload {
		var out []Workload
		for i := range n {
			out = append(out, wl(queue, string(rune('a'+i)), 100, time.Duration(n-i)*time.Minute, 1))
		}
		return out
	}
	tests := []struct {
		name    string
		tree    *Tree
		used    map[string]int64
		prio    int32
		running []Workload
		enough  func([]Workload) bool
		freed   int64 // GPUs of ty's work already leaving
		want    []string
		wantErr string
	}{
		{
			name: "the team's newest lower-tier workloads go, as few as admit it",
			tree: Build([]Spec{q("tx", "", 8), q("ty", "", 8)}), used: map[string]int64{"tx": 8, "ty": 8}, prio: 1000,
			running: append(lows("tx", 8), lows("ty", 8)...),
			want:    []string{"ty/h", "ty/g", "ty/f", "ty/e"},
		},
		{
			name: "at its limit, with GPUs idle",
			tree: Build([]Spec{q("tx", "", 8), q("ty", "", 8).limit(8)}), used: map[string]int64{"tx": 4, "ty": 8}, prio: 1000,
			running: append(lows("tx", 4), lows("ty", 8)...),
			enough:  func([]Workload) bool { return true }, // 4 idle GPUs: room is there
			want:    []string{"ty/h", "ty/g", "ty/f", "ty/e"},
		},
		{
			name: "lowest tier first",
			tree: Build([]Spec{q("tx", "", 8), q("ty", "", 8)}), used: map[string]int64{"tx": 8, "ty": 8}, prio: 1000,
			running: append(lows("tx", 8), append(lows("ty", 7), wl("ty", "lowest", 0, time.Hour, 1))...),
			want:    []string{"ty/lowest", "ty/g", "ty/f", "ty/e"},
		},
		{
			name: "what is already leaving counts: 2 evicted a moment ago, 2 more",
			tree: Build([]Spec{q("tx", "", 8), q("ty", "", 8)}), used: map[string]int64{"tx": 8, "ty": 8}, prio: 1000,
			running: append(lows("tx", 8), lows("ty", 6)...), freed: 2,
			enough: freed(2), // the 2 leaving free their GPUs too
			want:   []string{"ty/f", "ty/e"},
		},
		{
			name: "nothing more when what is leaving admits it",
			tree: Build([]Spec{q("tx", "", 8), q("ty", "", 8)}), used: map[string]int64{"tx": 8, "ty": 8}, prio: 1000,
			running: append(lows("tx", 8), lows("ty", 4)...), freed: 4,
			enough: func([]Workload) bool { return true },
			want:   nil,
		},
		{
			name: "the same tier is not preempted",
			tree: Build([]Spec{q("tx", "", 8), q("ty", "", 8)}), used: map[string]int64{"tx": 8, "ty": 8}, prio: 100,
			running: append(lows("tx", 8), lows("ty", 8)...),
			wantErr: "no preemptible workload of a lower priority",
		},
		{
			name: "another queue's work is never taken",
			tree: Build([]Spec{q("tx", "", 8), q("ty", "", 8)}), used: map[string]int64{"tx": 8, "ty": 8}, prio: 1000,
			running: lows("tx", 8),
			wantErr: "no preemptible workload",
		},
		{
			name: "not enough of its own to admit it",
			tree: Build([]Spec{q("tx", "", 8), q("ty", "", 8).limit(8)}), used: map[string]int64{"tx": 8, "ty": 8}, prio: 1000,
			running: append(lows("tx", 8), append(lows("ty", 2), wl("ty", "same-tier", 1000, time.Hour, 6))...),
			wantErr: "would not admit it",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := state(tc.tree, tc.used, nil)
			enough := tc.enough
			if enough == nil {
				enough = freed(4)
			}
			victims, err := s.PreemptOwn("ty", gpus(4), tc.prio, tc.running, gpus(tc.freed), enough)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("PreemptOwn = %v, %v; want an error containing %q", keys(victims), err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, keys(victims)); diff != "" {
				t.Errorf("victims (-want +got):\n%s", diff)
			}
		})
	}
}
