package jobs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// twoNodes is a 2 x 8-GPU cluster under strategy st, without quota or
// reservation unless the test sets them.
func twoNodes(st Strategy) Config {
	cfg := DefaultConfig()
	cfg.Strategy, cfg.Nodes, cfg.Teams, cfg.MaxBackfillWait, cfg.SampleEvery = st, 2, 0, 0, 0
	return cfg
}

func run(t *testing.T, jobs []Job, cfg Config) *Result {
	t.Helper()
	r, err := Run(jobs, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// hours converts seconds to the Result's hours.
func hours(sec float64) float64 { return sec / 3600 }

func TestStrategiesOnAPartialGang(t *testing.T) {
	// J1 holds node 0 until t=100. J2 needs both nodes. J3 is short.
	jobs := []Job{
		{ID: "j1", Submit: 0, Duration: 100, GPUs: 8},
		{ID: "j2", Submit: 1, Duration: 100, GPUs: 16},
		{ID: "j3", Submit: 2, Duration: 10, GPUs: 8},
	}
	type want struct {
		jct    []float64 // per job in finish order, seconds
		wasted float64   // GPU-seconds
		end    int64
	}
	tests := []struct {
		st   Strategy
		want want
	}{
		// Gang: J2 waits whole; J3 backfills on node 1 at once.
		{StrategyGang, want{jct: []float64{10, 100, 199}, end: 200}},
		// No gang: J2's first pod holds node 1 from t=1 to t=100, idle;
		// J3 waits for J2 to finish.
		{StrategyNoGang, want{jct: []float64{100, 199, 208}, wasted: 8 * 99, end: 210}},
		// FIFO: J3 may not pass J2.
		{StrategyFIFO, want{jct: []float64{100, 199, 208}, end: 210}},
	}
	for _, tc := range tests {
		t.Run(string(tc.st), func(t *testing.T) {
			r := run(t, jobs, twoNodes(tc.st))
			if diff := cmp.Diff(tc.want.jct, r.jctSeconds()); diff != "" {
				t.Errorf("job completion times in seconds (-want +got):\n%s", diff)
			}
			if r.WastedGPUHours != hours(tc.want.wasted) {
				t.Errorf("wasted = %v GPU-hours, want %v", r.WastedGPUHours, hours(tc.want.wasted))
			}
			if r.EndTime != tc.want.end || r.Finished != 3 || r.Unfinished != 0 {
				t.Errorf("end %d finished %d unfinished %d, want end %d and all 3 finished", r.EndTime, r.Finished, r.Unfinished, tc.want.end)
			}
		})
	}
}

func TestReservationStopsStarvation(t *testing.T) {
	jobs := []Job{
		{ID: "s1", Submit: 0, Duration: 100, GPUs: 8},
		{ID: "big", Submit: 1, Duration: 10, GPUs: 16},
		{ID: "s2", Submit: 50, Duration: 100, GPUs: 8},
	}
	// Pure backfill: s2 takes node 1 at t=50 and big waits until t=150.
	r := run(t, jobs, twoNodes(StrategyGang))
	if diff := cmp.Diff([]float64{100, 100, 159}, r.jctSeconds()); diff != "" {
		t.Errorf("backfill completion times (-want +got):\n%s", diff)
	}
	// Held after 10 s: node 1 stays free for big, which starts at t=100.
	cfg := twoNodes(StrategyGang)
	cfg.MaxBackfillWait = 10
	r = run(t, jobs, cfg)
	if diff := cmp.Diff([]float64{100, 109, 160}, r.jctSeconds()); diff != "" {
		t.Errorf("reservation completion times (-want +got):\n%s", diff)
	}
	// Node 1 sat idle for big from t=50 to t=100.
	if want := hours(8 * 50); r.ReservedIdleGPUHours != want {
		t.Errorf("reserved idle = %v GPU-hours, want %v", r.ReservedIdleGPUHours, want)
	}
}

func quotaConfig(nodes int) Config {
	cfg := twoNodes(StrategyGang)
	cfg.Nodes = nodes
	cfg.Teams = 2 // team-0 and team-1: min half the GPUs, max all
	return cfg
}

func TestReclaimEvictsBorrowedGangWhole(t *testing.T) {
	// The cluster: 32 GPUs, two teams of min 16 and max 32. Team 0
	// runs a 16-GPU job within its min and borrows 16 more for a 2-pod
	// gang; team 1 then asks for its min.
	jobs := []Job{
		{ID: "a-base", Team: "team-0", Submit: 0, Duration: 1000, GPUs: 16},
		{ID: "a-gang", Team: "team-0", Submit: 1, Duration: 1000, GPUs: 16},
		{ID: "b", Team: "team-1", Submit: 10, Duration: 10, GPUs: 16},
	}
	r := run(t, jobs, quotaConfig(4))
	if r.Evictions != 1 {
		t.Fatalf("evictions = %d, want 1", r.Evictions)
	}
	if want := hours(16 * 9); r.LostGPUHours != want {
		t.Errorf("lost = %v GPU-hours, want %v (both pods of the gang, 9 s each)", r.LostGPUHours, want)
	}
	// b runs 10..20; a-gang restarts at 20 and ends at 1020.
	if diff := cmp.Diff([]float64{10, 1000, 1019}, r.jctSeconds()); diff != "" {
		t.Errorf("completion times (-want +got):\n%s", diff)
	}
}

func TestReclaimSparesAJobInsideItsMin(t *testing.T) {
	// One 16-GPU job is half inside team 0's min of 8: evicting it would
	// put team 0 under its min, so team 1 waits instead (no flapping).
	jobs := []Job{
		{ID: "a-big", Team: "team-0", Submit: 0, Duration: 1000, GPUs: 16},
		{ID: "b", Team: "team-1", Submit: 10, Duration: 10, GPUs: 8},
	}
	r := run(t, jobs, quotaConfig(2))
	if r.Evictions != 0 {
		t.Fatalf("evictions = %d, want 0", r.Evictions)
	}
	if diff := cmp.Diff([]float64{1000, 1000}, r.jctSeconds()); diff != "" {
		t.Errorf("completion times (-want +got):\n%s", diff)
	}
}

func TestReclaimNeverTakesAMin(t *testing.T) {
	jobs := []Job{
		{ID: "a-min", Team: "team-0", Submit: 0, Duration: 1000, GPUs: 8},
		{ID: "a-borrowed", Team: "team-0", Submit: 1, Duration: 1000, GPUs: 8},
		{ID: "b", Team: "team-1", Submit: 10, Duration: 10, GPUs: 8},
	}
	r := run(t, jobs, quotaConfig(2))
	if r.Evictions != 1 {
		t.Fatalf("evictions = %d, want 1 (only the borrowed job)", r.Evictions)
	}
	// a-min keeps running: it finishes at 1000; a-borrowed restarts at 20.
	if diff := cmp.Diff([]float64{10, 1000, 1019}, r.jctSeconds()); diff != "" {
		t.Errorf("completion times (-want +got):\n%s", diff)
	}
	// With a grace period longer than b's wait there is no eviction.
	cfg := quotaConfig(2)
	cfg.ReclaimAfter = 2000
	r = run(t, jobs, cfg)
	if r.Evictions != 0 {
		t.Errorf("evictions with ReclaimAfter=2000 = %d, want 0", r.Evictions)
	}
}

func TestRunRejectsBadInput(t *testing.T) {
	cfg := twoNodes(StrategyGang)
	if _, err := Run([]Job{{ID: "huge", GPUs: 64}}, cfg); err == nil || !strings.Contains(err.Error(), "more than the cluster's 16") {
		t.Errorf("Run with a job bigger than the cluster = %v", err)
	}
	cfg.Strategy = "lottery"
	if _, err := Run(nil, cfg); err == nil || !strings.Contains(err.Error(), `unknown strategy "lottery"`) {
		t.Errorf("Run with an unknown strategy = %v", err)
	}
	cfg = twoNodes(StrategyGang)
	cfg.Policy = "nope"
	if _, err := Run(nil, cfg); err == nil {
		t.Error("Run with an unknown policy succeeded")
	}
}

func TestParseTrace(t *testing.T) {
	good := "job_id,submission_time,duration,num_gpu\nb,20,5,2\na,10,7,64\n"
	jobs, err := parseTrace(strings.NewReader(good), "t.csv")
	if err != nil {
		t.Fatal(err)
	}
	want := []Job{{ID: "a", Submit: 10, Duration: 7, GPUs: 64}, {ID: "b", Submit: 20, Duration: 5, GPUs: 2}}
	if diff := cmp.Diff(want, jobs); diff != "" {
		t.Errorf("parsed jobs (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]int{8, 8, 8, 8, 8, 8, 8, 8}, jobs[0].pods(8)); diff != "" {
		t.Errorf("64-GPU job's pods (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]int{8, 8}, Job{GPUs: 12}.pods(8)); diff != "" {
		t.Errorf("12-GPU job's pods (-want +got):\n%s", diff)
	}
	elastic := "job_id,submission_time,duration,num_gpu,min_gpu\na,10,7,32,16\nb,20,5,2,0\n"
	jobs, err = parseTrace(strings.NewReader(elastic), "t.csv")
	if err != nil {
		t.Fatal(err)
	}
	want = []Job{{ID: "a", Submit: 10, Duration: 7, GPUs: 32, MinGPUs: 16}, {ID: "b", Submit: 20, Duration: 5, GPUs: 2}}
	if diff := cmp.Diff(want, jobs); diff != "" {
		t.Errorf("parsed elastic jobs (-want +got):\n%s", diff)
	}
	bad := map[string]string{
		"missing column": "job_id,submission_time,duration\nx,1,1\n",
		"bad number":     "job_id,submission_time,duration,num_gpu\nx,soon,1,1\n",
		"zero GPUs":      "job_id,submission_time,duration,num_gpu\nx,1,1,0\n",
		"short row":      "job_id,submission_time,duration,num_gpu\nx,1,1\n",
		"min over size":  "job_id,submission_time,duration,num_gpu,min_gpu\nx,1,1,16,24\n",
		"bad min":        "job_id,submission_time,duration,num_gpu,min_gpu\nx,1,1,16,-8\n",
	}
	wantMsg := map[string]string{
		"missing column": `lacks column "num_gpu"`,
		"bad number":     `t.csv:2: column submission_time: "soon"`,
		"zero GPUs":      "t.csv:2: column num_gpu",
		"short row":      "t.csv:2: 3 fields",
		"min over size":  "t.csv:2: column min_gpu: 24 is more than the job's 16 GPUs",
		"bad min":        `t.csv:2: column min_gpu: "-8"`,
	}
	for name, data := range bad {
		if _, err := parseTrace(strings.NewReader(data), "t.csv"); err == nil || !strings.Contains(err.Error(), wantMsg[name]) {
			t.Errorf("%s: error = %v, want %q", name, err, wantMsg[name])
		}
	}
}

// TestITPTraceReplays runs every strategy on a real trace (cluster01: 1595
// jobs, gangs of up to 8 nodes) on 16 nodes: every job finishes, and gang
// scheduling wastes nothing on partial gangs while the no-gang baseline
// does.
func TestITPTraceReplays(t *testing.T) {
	path := filepath.Join("..", "..", "..", "shared", "traces", "microsoft-itp", "cluster01.csv")
	if _, err := os.Stat(path); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("trace missing under CI: %v", err)
		}
		t.Skipf("trace not available here: %v", err)
	}
	jobs, err := ReadTrace(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(jobs) != 1595 {
		t.Fatalf("cluster01 has %d jobs, want 1595", len(jobs))
	}
	results := map[Strategy]*Result{}
	for _, st := range Strategies() {
		cfg := DefaultConfig()
		cfg.Strategy, cfg.Nodes = st, 16
		results[st] = run(t, jobs, cfg)
		if r := results[st]; r.Finished != len(jobs) || r.Unfinished != 0 {
			t.Errorf("%s: finished %d of %d", st, r.Finished, len(jobs))
		}
	}
	if w := results[StrategyGang].WastedGPUHours; w != 0 {
		t.Errorf("gang wasted %v GPU-hours on partial gangs, want 0", w)
	}
	if w := results[StrategyNoGang].WastedGPUHours; w <= 0 {
		t.Errorf("no-gang wasted %v GPU-hours: its multi-node jobs should hold partial gangs", w)
	}
}

// FuzzParseTrace: any input parses or fails with an error, never a panic;
// what parses is sorted by submission, with at least one GPU per job and a
// minimum within its size.
func FuzzParseTrace(f *testing.F) {
	f.Add("job_id,submission_time,duration,num_gpu\nb,20,5,2\na,10,7,64\n")
	f.Add("job_id,submission_time,duration,num_gpu,min_gpu,expected_runtime\na,10,7,32,16,9\n")
	f.Add("num_gpu,job_id\n")
	f.Fuzz(func(t *testing.T, data string) {
		jobs, err := parseTrace(strings.NewReader(data), "f.csv")
		if err != nil {
			return
		}
		for i, j := range jobs {
			if j.GPUs < 1 || j.MinGPUs < 0 || j.MinGPUs > j.GPUs || j.Duration < 0 || j.Estimate < 0 {
				t.Fatalf("job %+v accepted", j)
			}
			if i > 0 && jobs[i-1].Submit > j.Submit {
				t.Fatalf("jobs out of submission order: %+v before %+v", jobs[i-1], j)
			}
		}
	})
}
