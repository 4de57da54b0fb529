package jobs

import (
	"fmt"
	"math/rand"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tessera-gpu/tessera/allocator"
)

// TestElasticGangStartsAtMinAndGrows: on 4 nodes, a rigid 2-node job runs
// until t=1000; an elastic 4 x 8 GPU gang of minimum 2 pods arrives at
// t=1. Where gangs are elastic it starts at once on the 2 free nodes and
// grows to 4 pods when the rigid job ends: 16000 pod-seconds of work, 2
// pods for 999 s, then 4 pods for ceil(14002 / 4) s, so it ends at 4501.
// Without gangs (nogang) and in strict FIFO it runs rigid: from 1000 to
// 5000.
func TestElasticGangStartsAtMinAndGrows(t *testing.T) {
	jobs := []Job{
		{ID: "rigid", Team: "team-0", Submit: 0, Duration: 1000, GPUs: 16},
		{ID: "elastic", Team: "team-0", Submit: 1, Duration: 4000, GPUs: 32, MinGPUs: 16},
	}
	elastic := map[string]int64{"rigid": 1000, "elastic": 4500}
	rigid := map[string]int64{"rigid": 1000, "elastic": 4999}
	tests := []struct {
		cfg   Config
		want  map[string]int64
		grows int
	}{
		{twoNodesOf(StrategyGang, 4), elastic, 2},
		{queuesConfig(4, 1), elastic, 2},
		{reserveConfig(4, time.Hour, true), elastic, 2},
		{twoNodesOf(StrategyNoGang, 4), rigid, 0},
		{twoNodesOf(StrategyFIFO, 4), rigid, 0},
	}
	for _, tc := range tests {
		t.Run(string(tc.cfg.Strategy), func(t *testing.T) {
			got, r := jctOf(t, jobs, tc.cfg)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("completion times in seconds (-want +got):\n%s", diff)
			}
			if r.ElasticGrows != tc.grows || r.ElasticShrinks != 0 || r.Evictions != 0 {
				t.Errorf("grows %d, shrinks %d, evictions %d; want %d, 0, 0", r.ElasticGrows, r.ElasticShrinks, r.Evictions, tc.grows)
			}
		})
	}
}

// TestElasticConfigMakesGangsElastic: Config.ElasticMin makes every job of
// several pods elastic (here 0.5: 2 of 4 pods), as Job.MinGPUs does.
func TestElasticConfigMakesGangsElastic(t *testing.T) {
	jobs := []Job{
		{ID: "rigid", Team: "team-0", Submit: 0, Duration: 1000, GPUs: 16, MinGPUs: 16},
		{ID: "elastic", Team: "team-0", Submit: 1, Duration: 4000, GPUs: 32},
	}
	cfg := twoNodesOf(StrategyGang, 4)
	cfg.ElasticMin = 0.5
	got, r := jctOf(t, jobs, cfg)
	if diff := cmp.Diff(map[string]int64{"rigid": 1000, "elastic": 4500}, got); diff != "" {
		t.Errorf("completion times in seconds (-want +got):\n%s", diff)
	}
	if r.ElasticGrows != 2 {
		t.Errorf("grows %d, want 2", r.ElasticGrows)
	}
	cfg.ElasticMin = 1.5
	if _, err := Run(jobs, cfg); err == nil {
		t.Error("ElasticMin 1.5 accepted")
	}
}

// TestElasticExtrasAreReclaimedFirst: team-0 (guarantee or min 16 of 32
// GPUs) runs an elastic 4 x 8 GPU gang of minimum 2 pods and a rigid 8-GPU
// job; the gang grew to 3 pods, so team-0 uses all 32. At t=100 team-1
// asks for 8 GPUs within its guarantee: reclaim takes back the gang's
// extra pod, not the rigid job (nothing is evicted, no work lost), and
// the gang grows again once team-1's job ends at 110 and when the rigid
// job ends at 1000. The gang's 4000 pod-seconds: 3 pods for 100 s, 2 for
// 10 s, 3 for 890 s, then 4 for ceil(1010 / 4) s: it ends at 1253.
func TestElasticExtrasAreReclaimedFirst(t *testing.T) {
	jobs := []Job{
		{ID: "elastic", Team: "team-0", Submit: 0, Duration: 1000, GPUs: 32, MinGPUs: 16},
		{ID: "rigid", Team: "team-0", Submit: 0, Duration: 1000, GPUs: 8},
		{ID: "b", Team: "team-1", Submit: 100, Duration: 10, GPUs: 8},
	}
	for _, cfg := range []Config{queuesConfig(4, 1), quotaConfig(4)} {
		t.Run(string(cfg.Strategy), func(t *testing.T) {
			got, r := jctOf(t, jobs, cfg)
			if diff := cmp.Diff(map[string]int64{"elastic": 1253, "rigid": 1000, "b": 10}, got); diff != "" {
				t.Errorf("completion times in seconds (-want +got):\n%s", diff)
			}
			if r.ElasticShrinks != 1 || r.ElasticGrows != 3 || r.Evictions != 0 || r.LostGPUHours != 0 {
				t.Errorf("shrinks %d, grows %d, evictions %d, lost %v GPU-h; want 1, 3, 0, 0", r.ElasticShrinks, r.ElasticGrows, r.Evictions, r.LostGPUHours)
			}
		})
	}
}

// TestElasticGangNeverBelowItsMinimum: team-0 (guarantee or min 16 of 32)
// runs an elastic 4 x 8 GPU gang at its minimum of 3 pods, borrowing 8;
// team-1 runs 8 GPUs and at t=100 asks for 8 more within its own 16. The
// gang has no pod beyond its minimum, and taking it whole would put
// team-0 below its guarantee, so nothing is taken: b waits for team-1's
// other job to end at 1000.
func TestElasticGangNeverBelowItsMinimum(t *testing.T) {
	jobs := []Job{
		{ID: "other", Team: "team-1", Submit: 0, Duration: 1000, GPUs: 8},
		{ID: "elastic", Team: "team-0", Submit: 1, Duration: 5000, GPUs: 32, MinGPUs: 24},
		{ID: "b", Team: "team-1", Submit: 100, Duration: 10, GPUs: 8},
	}
	for _, cfg := range []Config{queuesConfig(4, 1), quotaConfig(4)} {
		t.Run(string(cfg.Strategy), func(t *testing.T) {
			got, r := jctOf(t, jobs, cfg)
			if got["b"] != 910 {
				t.Errorf("b's completion time %d s, want 910 (started at 1000)", got["b"])
			}
			if r.ElasticShrinks != 0 || r.Evictions != 0 {
				t.Errorf("shrinks %d, evictions %d; want 0, 0", r.ElasticShrinks, r.Evictions)
			}
		})
	}
}

// TestElasticExtrasGiveWayToAReservation: an elastic gang took the whole
// cluster (4 of 4 pods, minimum 2); a rigid 2-node job waits from t=10 and
// is due a reservation after 60 s. At the next event (t=100) the
// reservation holds the nodes of the gang's two extra pods, counted as
// preemptible, and at the one after (t=200) takes them back: the job
// starts at 200 without an eviction.
func TestElasticExtrasGiveWayToAReservation(t *testing.T) {
	jobs := []Job{
		{ID: "elastic", Team: "team-0", Submit: 0, Duration: 10000, GPUs: 32, MinGPUs: 16},
		{ID: "big", Team: "team-0", Submit: 10, Duration: 100, GPUs: 16},
		{ID: "tick", Team: "team-0", Submit: 100, Duration: 1, GPUs: 1},
		{ID: "tock", Team: "team-0", Submit: 200, Duration: 1, GPUs: 1},
	}
	got, r := jctOf(t, jobs, reserveConfig(4, time.Minute, true))
	if got["big"] != 290 {
		t.Errorf("big's completion time %d s, want 290 (started at 200)", got["big"])
	}
	if r.ElasticShrinks != 2 || r.Evictions != 0 {
		t.Errorf("shrinks %d, evictions %d; want 2, 0", r.ElasticShrinks, r.Evictions)
	}
}

// TestElasticBooksBalance replays random jobs, half of them elastic gangs,
// under every strategy and checks that every job finishes, that no gang
// ever runs below its minimum or above its size, and that the books end
// empty: no GPU in use on any node, nothing used or pending in any team.
func TestElasticBooksBalance(t *testing.T) {
	rng := rand.New(rand.NewSource(7))
	sizes := []int{1, 4, 8, 16, 24, 32}
	var jobs []Job
	var at int64
	for i := 0; i < 300; i++ {
		at += int64(rng.Intn(1000))
		j := Job{ID: fmt.Sprintf("j%03d", i), Submit: at, Duration: int64(50 + rng.Intn(3000)), GPUs: sizes[rng.Intn(len(sizes))]}
		if j.GPUs > 8 && rng.Intn(2) == 0 {
			j.MinGPUs = 8 * (1 + rng.Intn(j.GPUs/8))
		}
		jobs = append(jobs, j)
	}
	configs := []Config{quotaConfig(4), queuesConfig(4, 0.5), reserveConfig(4, time.Hour, true), twoNodesOf(StrategyGang, 4)}
	cons := reserveConfig(4, time.Hour, true)
	cons.ConsolidateMovesPerMinute = 2
	configs = append(configs, cons)
	for i, cfg := range configs {
		t.Run(fmt.Sprintf("%d-%s", i, cfg.Strategy), func(t *testing.T) {
			policy, err := allocator.NewPolicy(cfg.Policy)
			if err != nil {
				t.Fatal(err)
			}
			s := newSim(cfg, policy)
			r, err := s.runObserved(jobs, func(j *jobState) {
				if j.placed < j.min || j.placed > len(j.sizes) {
					t.Errorf("job %s finished with %d pods, minimum %d of %d", j.job.ID, j.placed, j.min, len(j.sizes))
				}
			})
			if err != nil {
				t.Fatal(err)
			}
			if r.Finished != len(jobs) {
				t.Errorf("finished %d of %d", r.Finished, len(jobs))
			}
			if r.ElasticGrows == 0 {
				t.Error("no elastic gang grew")
			}
			t.Logf("grows %d, shrinks %d, evictions %d, consolidation moves %d", r.ElasticGrows, r.ElasticShrinks, r.Evictions, r.ConsolidationMoves)
			for _, n := range s.nodes {
				if free := n.Node.FullyFreeGPUs(); free != len(n.Node.GPUs) {
					t.Errorf("node %s: %d of %d GPUs free at the end", n.Node.Name, free, len(n.Node.GPUs))
				}
			}
			if s.runGPUs != 0 {
				t.Errorf("running GPUs %d at the end", s.runGPUs)
			}
			for _, team := range s.q.teams {
				if s.q.used[team] != 0 || s.q.pending[team] != 0 || len(s.q.waiting[team]) != 0 {
					t.Errorf("team %s: used %d, pending %d, waiting %v at the end", team, s.q.used[team], s.q.pending[team], s.q.waiting[team])
				}
			}
			if s.quota != nil {
				for ns, u := range s.quota.Used {
					for res, v := range u {
						if v != 0 {
							t.Errorf("quota of %s: %d %s used at the end", ns, v, res)
						}
					}
				}
			}
		})
	}
}
