package jobs

import (
	"fmt"
	"math"
	"math/rand"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tessera-gpu/tessera/allocator"
	"github.com/tessera-gpu/tessera/allocator/quota"
)

// queuesConfig is a cluster of nodes x 8 GPUs under StrategyQueues with two
// teams (team-0 under dept-0, team-1 under dept-1), each guaranteeing
// floor(capacity x fraction / 2).
func queuesConfig(nodes int, fraction float64) Config {
	cfg := twoNodes(StrategyQueues)
	cfg.Nodes = nodes
	cfg.Queues = QueueConfig{Teams: 2, GuaranteeFraction: fraction}
	return cfg
}

// jctByID runs jobs and returns each job's completion time in seconds.
func jctByID(t *testing.T, jobs []Job, cfg Config) (map[string]int64, *Result) {
	t.Helper()
	policy, err := allocator.NewPolicy(cfg.Policy)
	if err != nil {
		t.Fatal(err)
	}
	s := newSim(cfg, policy)
	out := map[string]int64{}
	r, err := s.runObserved(jobs, func(j *jobState) { out[j.job.ID] = s.now - j.job.Submit })
	if err != nil {
		t.Fatal(err)
	}
	return out, r
}

// runObserved runs jobs, calling finished as each job finishes.
func (s *sim) runObserved(jobs []Job, finished func(j *jobState)) (*Result, error) {
	s.q.afterFinish = finished
	return s.run(jobs)
}

func TestQueuesServeTheTeamWithLessHistoryFirst(t *testing.T) {
	// Two teams with equal guarantees (0 of 8 GPUs, so all is lent and
	// the order alone decides) both submit an 8-GPU job at t=4000; team-0
	// submits first, but it ran the whole node for an hour before.
	history := Job{ID: "history", Team: "team-0", Submit: 0, Duration: 3600, GPUs: 8}
	a := Job{ID: "a", Team: "team-0", Submit: 4000, Duration: 100, GPUs: 8}
	b := Job{ID: "b", Team: "team-1", Submit: 4000, Duration: 100, GPUs: 8}
	tests := []struct {
		name string
		cfg  Config
		jobs []Job
		want map[string]int64
	}{
		{"team-0 has history: team-1 goes first", queuesConfig(1, 0.1), []Job{history, a, b},
			map[string]int64{"history": 3600, "b": 100, "a": 200}},
		{"no history: by name, team-0 first", queuesConfig(1, 0.1), []Job{a, b},
			map[string]int64{"a": 100, "b": 200}},
		{"gang (arrival order) ignores history", twoNodesOf(StrategyGang, 1), []Job{history, a, b},
			map[string]int64{"history": 3600, "a": 100, "b": 200}},
		// Guarantees of 4 each, jobs of 8: they borrow, and neither
		// blocks the other (Admit protects only waiting work that could
		// start within a guarantee); the order is the same.
		{"guarantees 4 + 4, history: team-1 first", queuesConfig(1, 1), []Job{history, a, b},
			map[string]int64{"history": 3600, "b": 100, "a": 200}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, r := jctByID(t, tc.jobs, tc.cfg)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("completion times in seconds (-want +got):\n%s", diff)
			}
			if r.Evictions != 0 {
				t.Errorf("evictions = %d, want 0", r.Evictions)
			}
		})
	}
}

func twoNodesOf(st Strategy, nodes int) Config {
	cfg := twoNodes(st)
	cfg.Nodes = nodes
	return cfg
}

// TestQueuesJobsLargerThanGuaranteesRunInTurn: two teams guaranteeing 4
// GPUs each both wait with an 8-GPU job on an idle node. Each must borrow,
// and neither job could start within its team's guarantee, so the lending
// check protects nothing for the other (State.Waiting, allocator/queue
// since 69ff7a4): a runs first (by name, no history), b after it. Before,
// each counted the other's job as unmet guarantee and neither ever ran.
func TestQueuesJobsLargerThanGuaranteesRunInTurn(t *testing.T) {
	jobs := []Job{
		{ID: "a", Team: "team-0", Submit: 0, Duration: 100, GPUs: 8},
		{ID: "b", Team: "team-1", Submit: 0, Duration: 100, GPUs: 8},
	}
	got, r := jctByID(t, jobs, queuesConfig(1, 1))
	if diff := cmp.Diff(map[string]int64{"a": 100, "b": 200}, got); diff != "" {
		t.Errorf("completion times in seconds (-want +got):\n%s", diff)
	}
	if r.Finished != 2 || r.Unfinished != 0 || r.Evictions != 0 {
		t.Errorf("finished %d, unfinished %d, evictions %d; want 2, 0, 0", r.Finished, r.Unfinished, r.Evictions)
	}
}

func TestQueuesReclaim(t *testing.T) {
	tests := []struct {
		name      string
		nodes     int
		jobs      []Job
		evictions int
		lostGPUs  float64 // GPU-seconds
		want      map[string]int64
	}{
		{
			// Team 0 runs 8 GPUs within its guarantee and borrows 8
			// more; team 1 asks for its guarantee: the borrowed job is
			// evicted whole and restarts from zero at t=20.
			name:  "a team under its guarantee reclaims from a borrower",
			nodes: 2,
			jobs: []Job{
				{ID: "a-base", Team: "team-0", Submit: 0, Duration: 1000, GPUs: 8},
				{ID: "a-borrowed", Team: "team-0", Submit: 1, Duration: 1000, GPUs: 8},
				{ID: "b", Team: "team-1", Submit: 10, Duration: 10, GPUs: 8},
			},
			evictions: 1, lostGPUs: 8 * 9,
			want: map[string]int64{"a-base": 1000, "a-borrowed": 1019, "b": 10},
		},
		{
			// A 2-node gang borrowed half its GPUs: evicted whole.
			name:  "a borrowed gang is evicted whole",
			nodes: 4,
			jobs: []Job{
				{ID: "a-base", Team: "team-0", Submit: 0, Duration: 1000, GPUs: 16},
				{ID: "a-gang", Team: "team-0", Submit: 1, Duration: 1000, GPUs: 16},
				{ID: "b", Team: "team-1", Submit: 10, Duration: 10, GPUs: 16},
			},
			evictions: 1, lostGPUs: 16 * 9,
			want: map[string]int64{"a-base": 1000, "a-gang": 1019, "b": 10},
		},
		{
			// One 16-GPU job, half of it inside team 0's guarantee of 8:
			// evicting it would put team 0 below its guarantee, so team
			// 1 waits.
			name:  "no eviction takes a team below its guarantee",
			nodes: 2,
			jobs: []Job{
				{ID: "a-big", Team: "team-0", Submit: 0, Duration: 1000, GPUs: 16},
				{ID: "b", Team: "team-1", Submit: 10, Duration: 10, GPUs: 8},
			},
			want: map[string]int64{"a-big": 1000, "b": 1000},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, r := jctByID(t, tc.jobs, queuesConfig(tc.nodes, 1))
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("completion times in seconds (-want +got):\n%s", diff)
			}
			if r.Evictions != tc.evictions || r.LostGPUHours != hours(tc.lostGPUs) {
				t.Errorf("evictions %d lost %v GPU-h, want %d and %v", r.Evictions, r.LostGPUHours, tc.evictions, hours(tc.lostGPUs))
			}
		})
	}
}

// TestQueuesNeverEvictBelowGuarantee replays random job lists on 4 nodes
// with 2 to 4 teams and checks, at every eviction, that the victim's team
// still uses at least its guarantee, or falls below it by less than the
// evicted job borrowed (a job that straddles it), and that every job
// finishes (with 3
// or 4 teams the guarantees, 10 or 8 of 32 GPUs, are smaller than the
// 16-GPU jobs, which must borrow).
func TestQueuesNeverEvictBelowGuarantee(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	sizes := []int{1, 2, 4, 8, 16}
	evictions := 0
	for trial := 0; trial < 60; trial++ {
		teams := 2 + rng.Intn(3)
		var jobs []Job
		var at int64
		for i := 0; i < 40; i++ {
			at += int64(rng.Intn(200))
			jobs = append(jobs, Job{ID: fmt.Sprintf("j%d", i), Submit: at, Duration: 1 + int64(rng.Intn(2000)), GPUs: sizes[rng.Intn(len(sizes))]})
		}
		cfg := twoNodes(StrategyQueues)
		cfg.Nodes = 4
		cfg.Queues = QueueConfig{Teams: teams, HalfLife: 600e9}
		policy, err := allocator.NewPolicy(cfg.Policy)
		if err != nil {
			t.Fatal(err)
		}
		s := newSim(cfg, policy)
		s.q.afterEvict = func(j *jobState) {
			evictions++
			// Below its guarantee only by straddling it
			// (quota.Straddles): the job borrowed more than its team
			// is then short.
			u, g, w := s.q.used[j.fteam], s.q.guarantee, int64(j.job.GPUs)
			if short := g - u; short > 0 && (u+w <= g || u+w-g <= short) {
				t.Errorf("trial %d: evicting %s (%d GPUs) left %s at %d GPUs, %d below its guarantee %d, more than the job borrowed", trial, j.job.ID, j.job.GPUs, j.fteam, u, short, g)
			}
		}
		r, err := s.run(jobs)
		if err != nil {
			t.Fatal(err)
		}
		if r.Unfinished != 0 {
			t.Errorf("trial %d: %d jobs unfinished", trial, r.Unfinished)
		}
	}
	if evictions == 0 {
		t.Error("no trial evicted anything: the test checks nothing")
	}
}

func TestJain(t *testing.T) {
	tests := []struct {
		name string
		xs   []float64
		want float64
	}{
		{"all equal", []float64{0.7, 0.7, 0.7, 0.7}, 1},
		{"one team only", []float64{1, 0, 0, 0}, 0.25},
		{"one of two", []float64{2, 0}, 0.5},
		{"1 and 3", []float64{1, 3}, 16.0 / 20},
		{"all zero counts as equal", []float64{0, 0}, 1},
		{"none", nil, 1},
	}
	for _, tc := range tests {
		if got := Jain(tc.xs); math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("%s: Jain(%v) = %v, want %v", tc.name, tc.xs, got, tc.want)
		}
	}
}

func TestFairnessByHand(t *testing.T) {
	// One node, two teams guaranteeing 4 each, strict FIFO. x (team 0, 8
	// GPUs) runs 0..100; a (team 0) and b (team 1), 4 GPUs each, wait
	// 1..100. While waiting, demand is 12 and 4, so each team's fair share
	// is its guarantee, 4: team 0 receives 8 (x=2), team 1 nothing (x=0).
	jobs := []Job{
		{ID: "x", Team: "team-0", Submit: 0, Duration: 100, GPUs: 8},
		{ID: "a", Team: "team-0", Submit: 1, Duration: 100, GPUs: 4},
		{ID: "b", Team: "team-1", Submit: 1, Duration: 100, GPUs: 4},
	}
	cfg := twoNodesOf(StrategyFIFO, 1)
	cfg.Queues = QueueConfig{Teams: 2}
	r := run(t, jobs, cfg)
	want := Fairness{JainIndex: 0.5, MinShareRatio: 0, Teams: []TeamShare{
		{Team: "team-0", WaitingHours: hours(99), ReceivedGPUHours: hours(8 * 99), EntitledGPUHours: hours(4 * 99), Ratio: 2, UsedGPUHours: hours(8*100 + 4*100)},
		{Team: "team-1", WaitingHours: hours(99), ReceivedGPUHours: 0, EntitledGPUHours: hours(4 * 99), Ratio: 0, UsedGPUHours: hours(4 * 100)},
	}}
	if diff := cmp.Diff(want, r.Fairness); diff != "" {
		t.Errorf("fairness (-want +got):\n%s", diff)
	}
}

func TestQueueConfigRejectsBadFraction(t *testing.T) {
	cfg := queuesConfig(1, 1.5)
	if _, err := Run(nil, cfg); err == nil {
		t.Error("a guarantee fraction of 1.5 was accepted")
	}
}

// TestQueuesWaitingPrefixAdmitsAsEveryJob: state lists of each team's
// waiting jobs only those, smallest first, that fit in what its guarantee
// leaves; Admit must answer exactly as with every waiting job listed.
func TestQueuesWaitingPrefixAdmitsAsEveryJob(t *testing.T) {
	rng := rand.New(rand.NewSource(2))
	sizes := []int{1, 2, 4, 8, 16, 32, 64}
	policy, err := allocator.NewPolicy(queuesConfig(16, 1).Policy)
	if err != nil {
		t.Fatal(err)
	}
	for trial := 0; trial < 300; trial++ {
		cfg := queuesConfig(16, []float64{1, 0.5, 0.25}[rng.Intn(3)])
		cfg.Queues.Teams = 2 + rng.Intn(3)
		s := newSim(cfg, policy)
		left := s.q.capacity
		for _, team := range s.q.teams {
			u := min(int64(rng.Intn(int(s.q.guarantee)*2+1)), left)
			s.q.used[team], left = u, left-u
			for i := rng.Intn(12); i > 0; i-- {
				s.queueArrive(&jobState{job: Job{GPUs: sizes[rng.Intn(len(sizes))]}, fteam: team})
			}
		}
		got := s.state()
		all := s.books()
		all.Waiting = map[string][]quota.Resources{}
		for team, bySize := range s.q.waiting {
			for g, n := range bySize {
				for range n {
					all.Waiting[team] = append(all.Waiting[team], gpuRes(g))
				}
			}
		}
		for _, team := range s.q.teams {
			for _, g := range sizes {
				if a, b := got.Admit(team, gpuRes(g)), all.Admit(team, gpuRes(g)); a != b {
					t.Fatalf("trial %d, %s asks %d GPUs: Admit with the prefix %+v, with every waiting job %+v (used %v, waiting %v)", trial, team, g, a, b, s.q.used, s.q.waiting)
				}
			}
		}
	}
}
