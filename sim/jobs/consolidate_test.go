package jobs

import (
	"testing"
	"time"
)

// Three 8-GPU nodes each run one long 1-GPU job (the 7-GPU jobs beside
// them ended): 21 GPUs free, no node empty. A 16-GPU job waits behind
// them. With consolidation, two of the small jobs move to the third node
// (each restarts, its work lost) and the big job starts at once; without,
// it waits until two of them end. With one move per minute it would need
// two: nothing moves.
func TestConsolidationGivesAGangWholeNodes(t *testing.T) {
	jobs := []Job{
		{ID: "w0", Submit: 0, Duration: 10, GPUs: 7},
		{ID: "w1", Submit: 0, Duration: 10, GPUs: 7},
		{ID: "w2", Submit: 0, Duration: 10, GPUs: 7},
		{ID: "s0", Submit: 1, Duration: 10000, GPUs: 1},
		{ID: "s1", Submit: 1, Duration: 10000, GPUs: 1},
		{ID: "s2", Submit: 1, Duration: 10000, GPUs: 1},
		{ID: "big", Submit: 100, Duration: 100, GPUs: 16},
	}
	for _, tc := range []struct {
		name      string
		perMinute int
		// the big job's completion time, and the moves
		jct   int64
		moves int
	}{
		{"consolidation", 4, 100, 2},
		{"off", 0, 10001 - 100 + 100, 0},
		{"over budget", 1, 10001 - 100 + 100, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := reserveConfig(3, 0, false)
			cfg.ConsolidateMovesPerMinute = tc.perMinute
			jct, r := jctOf(t, jobs, cfg)
			if jct["big"] != tc.jct {
				t.Errorf("big's JCT %d s, want %d", jct["big"], tc.jct)
			}
			if r.ConsolidationMoves != tc.moves || r.Evictions != tc.moves {
				t.Errorf("%d consolidation moves, %d evictions; want %d", r.ConsolidationMoves, r.Evictions, tc.moves)
			}
			if r.Finished != len(jobs) {
				t.Errorf("%d of %d jobs finished", r.Finished, len(jobs))
			}
			if tc.moves > 0 {
				// The two moved jobs restarted at 100 s: 10000 s more.
				moved := 0
				for _, id := range []string{"s0", "s1", "s2"} {
					if jct[id] == 100+10000-1 {
						moved++
					}
				}
				if moved != tc.moves {
					t.Errorf("small jobs' JCTs %d %d %d: want %d restarted at 100 s", jct["s0"], jct["s1"], jct["s2"], tc.moves)
				}
			}
		})
	}
	cfg := reserveConfig(3, time.Hour, false)
	cfg.ConsolidateMovesPerMinute = -1
	if _, err := Run(jobs, cfg); err == nil {
		t.Error("negative moves per minute accepted")
	}
}
