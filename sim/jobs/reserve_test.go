package jobs

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/tessera-gpu/tessera/allocator/reserve"
)

// reserveConfig is StrategyReserve on nodes x 8 GPUs, reserving for jobs of
// 16 GPUs or more after wait.
func reserveConfig(nodes int, wait time.Duration, preemptible bool) Config {
	cfg := twoNodes(StrategyReserve)
	cfg.Nodes = nodes
	cfg.Reserve = reserve.Policy{MinGPUs: 16, Wait: wait, Preemptible: preemptible}
	return cfg
}

// jctOf returns each job's completion time in seconds by ID.
func jctOf(t *testing.T, jobs []Job, cfg Config) (map[string]int64, *Result) {
	t.Helper()
	r := run(t, jobs, cfg)
	out := map[string]int64{}
	for id, sec := range r.jctByID {
		out[id] = sec
	}
	return out, r
}

func TestReserveStreamDoesNotStarveGang(t *testing.T) {
	// A stream of 1-GPU jobs, one every 10 s, each 200 s: 20 GPUs of
	// demand on 16, so the cluster never drains by itself until the stream
	// ends at t=4000. The 2 x 8 GPU gang arrives at t=5.
	var jobs []Job
	for i := 0; i < 400; i++ {
		jobs = append(jobs, Job{ID: fmt.Sprintf("s%03d", i), Submit: int64(i * 10), Duration: 200, GPUs: 1})
		if i == 0 {
			jobs = append(jobs, Job{ID: "gang", Submit: 5, Duration: 100, GPUs: 16})
		}
	}
	const wait = 300 * time.Second
	tests := []struct {
		name string
		cfg  Config
		// The gang's completion time is at most maxJCT and at least minJCT.
		minJCT, maxJCT int64
		evictions      bool
	}{
		// Pure backfill: 1-GPU jobs keep taking freed GPUs; the gang
		// starts only when the stream has ended.
		{"backfill", twoNodes(StrategyGang), 3900, 1 << 40, false},
		// Reservation after 300 s: both nodes are held, no new job starts
		// on them, and the running ones are done within 200 s.
		{"reserve", reserveConfig(2, wait, false), 0, 5 + 300 + 200 + 100, false},
		// Preemptible: jobs keep starting on held GPUs and are evicted
		// once the other jobs there have finished.
		{"reserve preemptible", reserveConfig(2, wait, true), 0, 5 + 300 + 200 + 100, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			jct, r := jctOf(t, jobs, tc.cfg)
			if got := jct["gang"]; got < tc.minJCT || got > tc.maxJCT {
				t.Errorf("gang completion time %d s, want %d..%d", got, tc.minJCT, tc.maxJCT)
			}
			if r.Finished != len(jobs) {
				t.Errorf("%d of %d jobs finished", r.Finished, len(jobs))
			}
			if (r.Evictions > 0) != tc.evictions || (r.LostGPUHours > 0) != tc.evictions {
				t.Errorf("evictions %d, lost %v GPU-h; want evictions: %v", r.Evictions, r.LostGPUHours, tc.evictions)
			}
			if tc.cfg.Strategy == StrategyReserve && !tc.cfg.Reserve.Preemptible && r.ReservedIdleGPUHours == 0 {
				t.Error("held GPUs idled 0 GPU-hours: the held nodes should have drained idle")
			}
		})
	}
}

func TestReserveBackfill(t *testing.T) {
	// Three nodes. p (6 GPUs, long) and q (4 GPUs, until 300) leave node
	// 2 free; the gang (16 GPUs) is due at once, and the nodes with the
	// fewest GPUs to drain, q's and the free one, are held for it. s1 fits
	// in the 2 GPUs left beside p, outside the reservation.
	base := []Job{
		{ID: "p", Submit: 0, Duration: 1000, GPUs: 6},
		{ID: "q", Submit: 0, Duration: 300, GPUs: 4},
		{ID: "gang", Submit: 1, Duration: 100, GPUs: 16},
		{ID: "s1", Submit: 2, Duration: 10, GPUs: 2},
	}
	long := Job{ID: "s2", Submit: 3, Duration: 1000, GPUs: 1}
	tests := []struct {
		name string
		jobs []Job
		cfg  Config
		want map[string]int64
		// evictions and lost GPU-seconds
		evictions int
		lost      float64
	}{
		{
			// Pure backfill: s1 and s2 start at once; the gang waits for
			// two whole nodes, at t=1000 when p ends.
			name: "backfill", jobs: append(append([]Job(nil), base...), long), cfg: withNodes(twoNodes(StrategyGang), 3),
			want: map[string]int64{"p": 1000, "q": 300, "s1": 10, "s2": 1000, "gang": 1099},
		},
		{
			// s1 backfills outside; s2 may not start inside the held
			// nodes (6 free GPUs there) and waits for s1's GPUs outside,
			// at t=12; the gang starts when q ends.
			name: "reserve", jobs: append(append([]Job(nil), base...), long), cfg: reserveConfig(3, 0, false),
			want: map[string]int64{"p": 1000, "q": 300, "s1": 10, "gang": 399, "s2": 1009},
		},
		{
			// Preemptible: s2 starts inside at t=3, is evicted at t=300
			// when q ends (297 GPU-s lost), and starts again at once
			// outside, on the GPUs s1 left.
			name: "reserve preemptible", jobs: append(append([]Job(nil), base...), long), cfg: reserveConfig(3, 0, true),
			want:      map[string]int64{"p": 1000, "q": 300, "s1": 10, "gang": 399, "s2": 1297},
			evictions: 1, lost: 297,
		},
		{
			// A short job inside the reservation ends before it fills:
			// nothing is evicted.
			name: "reserve preemptible short", jobs: append(append([]Job(nil), base...), Job{ID: "s2", Submit: 3, Duration: 50, GPUs: 1}), cfg: reserveConfig(3, 0, true),
			want: map[string]int64{"p": 1000, "q": 300, "s1": 10, "gang": 399, "s2": 50},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			jct, r := jctOf(t, tc.jobs, tc.cfg)
			if diff := cmp.Diff(tc.want, jct); diff != "" {
				t.Errorf("completion times in seconds (-want +got):\n%s", diff)
			}
			if r.Evictions != tc.evictions || r.LostGPUHours != hours(tc.lost) {
				t.Errorf("evictions %d, lost %v GPU-h; want %d, %v", r.Evictions, r.LostGPUHours, tc.evictions, hours(tc.lost))
			}
		})
	}
}

func TestReservationMovesAndEnds(t *testing.T) {
	// p holds node 0 until 50, q node 1 until 300. The gang is due at
	// once and holds node 2 and a busy node; at t=50 node 0 drains whole,
	// the reservation moves there and the gang starts on nodes 0 and 2.
	// Once it started the reservation is gone: s (8 GPUs, t=60) starts as
	// soon as q's node is free, and the second gang g2 gets the next
	// reservation.
	jobs := []Job{
		{ID: "p", Submit: 0, Duration: 50, GPUs: 8},
		{ID: "q", Submit: 0, Duration: 300, GPUs: 7},
		{ID: "gang", Submit: 1, Duration: 1000, GPUs: 16},
		{ID: "s", Submit: 60, Duration: 100, GPUs: 1},
		{ID: "g2", Submit: 70, Duration: 10, GPUs: 16},
	}
	jct, r := jctOf(t, jobs, reserveConfig(3, 0, false))
	want := map[string]int64{"p": 50, "q": 300, "gang": 1049, "s": 100, "g2": 1050 - 70 + 10}
	if diff := cmp.Diff(want, jct); diff != "" {
		t.Errorf("completion times in seconds (-want +got):\n%s", diff)
	}
	if r.Evictions != 0 {
		t.Errorf("evictions = %d, want 0", r.Evictions)
	}
}

func TestReserveBigGangMetric(t *testing.T) {
	jobs := []Job{
		{ID: "a", Submit: 0, Duration: 7200, GPUs: 16},
		{ID: "b", Submit: 0, Duration: 36000, GPUs: 8},
	}
	r := run(t, jobs, reserveConfig(3, time.Hour, false))
	if r.MaxBigGangJCTHours != 2 || r.MaxJCTHours != 10 {
		t.Errorf("max big-gang JCT %v h, max JCT %v h; want 2 and 10", r.MaxBigGangJCTHours, r.MaxJCTHours)
	}
}

func TestReserveRejectsBadPolicy(t *testing.T) {
	cfg := reserveConfig(2, -time.Second, false)
	if _, err := Run([]Job{{ID: "a", GPUs: 1, Duration: 1}}, cfg); err == nil {
		t.Error("a negative wait was accepted")
	}
}

func withNodes(cfg Config, n int) Config {
	cfg.Nodes = n
	return cfg
}

// OverdueFirst: two 16-GPU jobs wait on a full 2-node cluster, the long
// one (10000 s) due first; at t=200 the short one (100 s) has the higher
// response ratio, so in short-first order it would take the one
// reservation and the long one would start after it. With OverdueFirst
// the slot goes to the long one, overdue longer.
func TestReserveOverdueFirst(t *testing.T) {
	jobs := []Job{
		{ID: "a", Submit: 0, Duration: 1000, GPUs: 8},
		{ID: "b", Submit: 0, Duration: 2000, GPUs: 8},
		{ID: "long", Submit: 10, Duration: 10000, GPUs: 16},
		{ID: "short", Submit: 20, Duration: 100, GPUs: 16},
		{ID: "tick", Submit: 200, Duration: 50, GPUs: 1},
	}
	for _, tc := range []struct {
		overdue   bool
		long, sht int64 // completion times, seconds
	}{
		{false, 2100 + 10000 - 10, 2100 - 20},
		{true, 2000 + 10000 - 10, 12000 + 50 + 100 - 20}, // after tick, which goes first when long ends
	} {
		cfg := twoNodes(StrategyReserve)
		cfg.Reserve = reserve.Policy{MinGPUs: 16, Wait: 100 * time.Second, ShortFirst: true, Max: 1, OverdueFirst: tc.overdue}
		var err error
		if cfg.Estimates, err = ParseEstimates("oracle"); err != nil {
			t.Fatal(err)
		}
		jct, _ := jctOf(t, jobs, cfg)
		if jct["long"] != tc.long || jct["short"] != tc.sht {
			t.Errorf("overdue-first %v: long's JCT %d s, short's %d s; want %d and %d", tc.overdue, jct["long"], jct["short"], tc.long, tc.sht)
		}
	}
}
