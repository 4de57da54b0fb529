package jobs

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/tessera-gpu/tessera/allocator/reserve"
)

// easyConfig is StrategyReserve with EASY backfill by estimates on nodes x
// 8 GPUs: jobs of 16 GPUs or more are due at once.
func easyConfig(nodes int, e Estimates, preemptible bool) Config {
	cfg := reserveConfig(nodes, 0, preemptible)
	cfg.Reserve.Estimates = true
	cfg.Estimates = e
	return cfg
}

func TestEASYBackfill(t *testing.T) {
	// Three nodes. p holds node 0 until 1000, q node 1 until 300; the
	// gang (16 GPUs) is due at once and holds nodes 1 and 2: it starts at
	// 300 when q ends. s (8 GPUs) arrives at t=2 and fits only on held
	// node 2.
	jobs := func(sDuration, sEstimate int64) []Job {
		return []Job{
			{ID: "p", Submit: 0, Duration: 1000, GPUs: 8, Estimate: 1000},
			{ID: "q", Submit: 0, Duration: 300, GPUs: 8, Estimate: 300},
			{ID: "gang", Submit: 1, Duration: 100, GPUs: 16, Estimate: 100},
			{ID: "s", Submit: 2, Duration: sDuration, GPUs: 8, Estimate: sEstimate},
		}
	}
	trace := Estimates{Kind: EstimateTrace}
	tests := []struct {
		name      string
		jobs      []Job
		cfg       Config
		want      map[string]int64
		evictions int
	}{
		{
			// s ends (by its estimate, 250) before the gang's start at
			// 300: it backfills on held node 2 at once.
			name: "ends before the reservation", jobs: jobs(200, 250), cfg: easyConfig(3, trace, false),
			want: map[string]int64{"p": 1000, "q": 300, "gang": 399, "s": 200},
		},
		{
			// Without estimates s may not start inside and waits for the
			// gang to end (t=400).
			name: "estimates off", jobs: jobs(200, 250), cfg: reserveConfig(3, 0, false),
			want: map[string]int64{"p": 1000, "q": 300, "gang": 399, "s": 400 + 200 - 2},
		},
		{
			// s would end after the start: refused, it waits.
			name: "ends after the reservation", jobs: jobs(200, 400), cfg: easyConfig(3, trace, false),
			want: map[string]int64{"p": 1000, "q": 300, "gang": 399, "s": 400 + 200 - 2},
		},
		{
			// s declares none: refused.
			name: "no estimate", jobs: jobs(200, 0), cfg: easyConfig(3, trace, false),
			want: map[string]int64{"p": 1000, "q": 300, "gang": 399, "s": 400 + 200 - 2},
		},
		{
			// s lied (runs 500, declared 250): it is evicted at 300 when
			// the gang could otherwise start, and runs again after it.
			name: "overruns its estimate", jobs: jobs(500, 250), cfg: easyConfig(3, trace, false),
			want:      map[string]int64{"p": 1000, "q": 300, "gang": 399, "s": 400 + 500 - 2},
			evictions: 1,
		},
		{
			// The oracle: s's estimate is its duration, 200.
			name: "oracle", jobs: jobs(200, 0), cfg: easyConfig(3, Estimates{Kind: EstimateOracle}, false),
			want: map[string]int64{"p": 1000, "q": 300, "gang": 399, "s": 200},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			jct, r := jctOf(t, tc.jobs, tc.cfg)
			if diff := cmp.Diff(tc.want, jct); diff != "" {
				t.Errorf("completion times in seconds (-want +got):\n%s", diff)
			}
			if r.Evictions != tc.evictions {
				t.Errorf("evictions %d, want %d", r.Evictions, tc.evictions)
			}
		})
	}
}

func TestEASYHoldsTheNodesThatDrainFirst(t *testing.T) {
	// a (1 GPU) holds node 0 until 1000; b1 and b2 (4 GPUs each) node 1
	// until 100 and 150; node 2 is free. By GPUs to drain the gang holds
	// nodes 0 and 2, so c (4 GPUs, long) starts on node 1 at 120 and the
	// gang waits for a, until 1000. By estimates it holds nodes 1 and 2
	// (drained at 150, node 0 only at 1000): c starts on node 0 and the
	// gang at 150.
	jobs := []Job{
		{ID: "a", Submit: 0, Duration: 1000, GPUs: 1},
		{ID: "b1", Submit: 0, Duration: 100, GPUs: 4},
		{ID: "b2", Submit: 0, Duration: 150, GPUs: 4},
		{ID: "gang", Submit: 1, Duration: 10, GPUs: 16},
		{ID: "c", Submit: 120, Duration: 5000, GPUs: 4},
	}
	for _, tc := range []struct {
		name string
		cfg  Config
		want int64
	}{
		{"by GPUs to drain", reserveConfig(3, 0, false), 1000 + 10 - 1},
		{"by estimates", easyConfig(3, Estimates{Kind: EstimateOracle}, false), 150 + 10 - 1},
	} {
		jct, _ := jctOf(t, jobs, tc.cfg)
		if jct["gang"] != tc.want || jct["c"] != 5000 {
			t.Errorf("%s: gang, c completion times %d, %d s; want %d, 5000", tc.name, jct["gang"], jct["c"], tc.want)
		}
	}
}

func TestEstimatesRuntime(t *testing.T) {
	user := Estimates{Kind: EstimateUser, Factor: 2}
	tests := []struct {
		e    Estimates
		job  Job
		want reserve.Runtime
	}{
		{Estimates{Kind: EstimateNone}, Job{ID: "a", Duration: 60}, reserve.Runtime{}},
		{Estimates{Kind: EstimateOracle}, Job{ID: "a", Duration: 60}, reserve.Expect(time.Minute)},
		{Estimates{Kind: EstimateTrace}, Job{ID: "a", Duration: 60, Estimate: 90}, reserve.Expect(90 * time.Second)},
		{Estimates{Kind: EstimateTrace}, Job{ID: "a", Duration: 60}, reserve.Runtime{}},
		{user, Job{ID: "a", Duration: 60}, reserve.Expect(time.Hour)},                  // 2 min: the 1 h class
		{user, Job{ID: "a", Duration: 3 * 3600}, reserve.Expect(8 * time.Hour)},        // 6 h: 8 h
		{user, Job{ID: "a", Duration: 5 * 86400}, reserve.Expect(14 * 24 * time.Hour)}, // 10 d: 14 d
		{user, Job{ID: "a", Duration: 20 * 86400}, reserve.Runtime{}},                  // 40 d: beyond every class
		{Estimates{Kind: EstimateUser, Factor: 1, Missing: 1}, Job{ID: "a", Duration: 60}, reserve.Runtime{}},
	}
	for _, tc := range tests {
		if got := tc.e.runtime(tc.job); got != tc.want {
			t.Errorf("%v of %+v = %+v, want %+v", tc.e, tc.job, got, tc.want)
		}
	}
	// About the share Missing declares none.
	half := Estimates{Kind: EstimateUser, Factor: 1, Missing: 0.5}
	none := 0
	for i := 0; i < 1000; i++ {
		if !half.runtime(Job{ID: strings.Repeat("x", i%7) + string(rune('a'+i%26)) + time.Duration(i).String(), Duration: 60}).Known {
			none++
		}
	}
	if none < 400 || none > 600 {
		t.Errorf("%d of 1000 jobs declared none with Missing 0.5", none)
	}
}

func TestParseEstimates(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Estimates
		err  bool
	}{
		{"none", Estimates{Kind: EstimateNone}, false},
		{"oracle", Estimates{Kind: EstimateOracle}, false},
		{"trace", Estimates{Kind: EstimateTrace}, false},
		{"user2x-miss0.2", Estimates{Kind: EstimateUser, Factor: 2, Missing: 0.2}, false},
		{"user0.5x-miss0", Estimates{}, true},
		{"user2x-miss1.5", Estimates{}, true},
		{"user2x", Estimates{}, true},
		{"userAx-missB", Estimates{}, true},
		{"perfect", Estimates{}, true},
		// Found by FuzzParseEstimates: NaN passed the range checks, an
		// infinite factor declared a 1 h limit (the duration conversion
		// overflows).
		{"userNaNx-miss0.2", Estimates{}, true},
		{"user2x-missNaN", Estimates{}, true},
		{"userInfx-miss0", Estimates{}, true},
	} {
		got, err := ParseEstimates(tc.in)
		// On an error too got must be tc.want, the zero model.
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("ParseEstimates(%q) = %+v, %v; want %+v, error %v", tc.in, got, err, tc.want, tc.err)
		}
		if !tc.err && got.String() != tc.in {
			t.Errorf("%q: String() = %q", tc.in, got.String())
		}
	}
}

func TestShortFirst(t *testing.T) {
	// One 8-GPU node, busy until 100. long (8 GPUs, 1000 s) arrives
	// before short (8 GPUs, 10 s). In arrival order long starts at 100 and
	// short at 1100; short first, short starts at 100 and long at 110.
	jobs := []Job{
		{ID: "busy", Submit: 0, Duration: 100, GPUs: 8},
		{ID: "long", Submit: 1, Duration: 1000, GPUs: 8},
		{ID: "short", Submit: 2, Duration: 10, GPUs: 8},
	}
	for _, tc := range []struct {
		name       string
		shortFirst bool
		want       map[string]int64
	}{
		{"arrival order", false, map[string]int64{"busy": 100, "long": 1099, "short": 1108}},
		{"short first", true, map[string]int64{"busy": 100, "short": 108, "long": 1109}},
	} {
		cfg := easyConfig(1, Estimates{Kind: EstimateOracle}, false)
		cfg.Reserve.ShortFirst = tc.shortFirst
		jct, _ := jctOf(t, jobs, cfg)
		if diff := cmp.Diff(tc.want, jct); diff != "" {
			t.Errorf("%s: completion times (-want +got):\n%s", tc.name, diff)
		}
	}
}
