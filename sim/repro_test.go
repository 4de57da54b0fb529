//go:build simrepro

// The full reproduction of the FGD paper's experiments on the Alibaba GPU
// trace. It runs 280 simulations (about 5 minutes on 2 lightly loaded cores), so it
// is behind the simrepro build tag and needs a longer timeout than go
// test's default 10 minutes on a busy machine:
//
//	go test -tags simrepro -run Repro -timeout 30m -v ./sim/
package sim

import (
	"context"
	"runtime"
	"testing"
)

var reproSeeds = []int64{42, 43, 44, 45, 46, 47, 48, 49, 50, 51}

// The deterministic baselines, whose published curves we reproduce point
// for point.
var deterministicBaselines = []string{"dotprod", "gpuclustering", "gpupacking", "bestfit", "fgd"}

// Goal of our policy on the default trace: unallocated GPU % at 100%
// arrived, mean over seeds 42..51.
const tesseraGoal = 4.0

func reproWorkers() int { return min(2, runtime.NumCPU()) }

func runGrid(t *testing.T, workload string, policies []string) map[string][]*Result {
	t.Helper()
	tr := loadTraceTB(t, workload)
	results, err := RunAll(context.Background(), Jobs([]*Trace{tr}, policies, reproSeeds, Config{}), reproWorkers(), nil)
	if err != nil {
		t.Fatal(err)
	}
	out := make(map[string][]*Result)
	for _, r := range results {
		out[r.Policy] = append(out[r.Policy], r)
	}
	return out
}

func unallocAt100(t *testing.T, rs []*Result) Stats {
	t.Helper()
	var v []float64
	for _, r := range rs {
		p, ok := At(r.Curve, 100)
		if !ok {
			t.Fatalf("%s seed %d has no point at 100%%", r.Policy, r.Seed)
		}
		v = append(v, p.UnallocatedPct)
	}
	return MeanSD(v)
}

// checkExact compares every seed's curve with the published one. The
// artifact's 2-decimal rounding of means that fall on a tie can differ by
// 0.01; anything larger is a failure.
func checkExact(t *testing.T, published []PublishedCurve, workload string, rs []*Result) {
	t.Helper()
	points, diffs := 0, 0
	for _, r := range rs {
		want := findPublished(published, "openb_pod_list_"+workload, r.Policy, r.Seed)
		if want == nil {
			t.Errorf("%s %s seed %d: no published curve", workload, r.Policy, r.Seed)
			continue
		}
		n, d := curveDiff(t, r.Curve, want)
		if d > 0.0100001 {
			t.Errorf("%s %s seed %d: %d points differ from the published curve, by up to %.2f", workload, r.Policy, r.Seed, n, d)
		}
		points += len(r.Curve)
		diffs += n
	}
	t.Logf("%s %s: %d of %d points equal to the published curves, %d differ by 0.01 (rounding of tied means)",
		workload, rs[0].Policy, points-diffs, points, diffs)
	if diffs*50 > points {
		t.Errorf("%s %s: %d of %d points differ by 0.01; more than 2%% is not rounding", workload, rs[0].Policy, diffs, points)
	}
}

// TestReproDefault runs all seven policies on the default trace and checks
// the paper's headline numbers, the exact per-seed curves of the
// deterministic baselines and our policy's goal.
func TestReproDefault(t *testing.T) {
	published := publishedTB(t)
	pub := PublishedAt100(published)
	policies := []string{"random", "dotprod", "gpuclustering", "gpupacking", "bestfit", "fgd", "tessera"}
	got := runGrid(t, "default", policies)
	for _, p := range policies {
		s := unallocAt100(t, got[p])
		if ps, ok := pub[[2]string{"openb_pod_list_default", p}]; ok {
			t.Logf("default %-13s unallocated@100 %.2f ± %.2f (published %.2f ± %.2f)", p, s.Mean, s.SD, ps.Mean, ps.SD)
		} else {
			t.Logf("default %-13s unallocated@100 %.2f ± %.2f", p, s.Mean, s.SD)
		}
	}
	targets := []struct {
		policy    string
		mean, tol float64
	}{{"random", 13.7, 0.7}, {"bestfit", 7.1, 0.5}, {"fgd", 4.8, 0.4}}
	for _, tg := range targets {
		if s := unallocAt100(t, got[tg.policy]); s.Mean < tg.mean-tg.tol || s.Mean > tg.mean+tg.tol {
			t.Errorf("%s: unallocated@100 %.2f, want %.1f ± %.1f", tg.policy, s.Mean, tg.mean, tg.tol)
		}
	}
	for _, p := range deterministicBaselines {
		checkExact(t, published, "default", got[p])
	}
	fgd, ours := unallocAt100(t, got["fgd"]), unallocAt100(t, got["tessera"])
	t.Run("tessera below fgd", func(t *testing.T) {
		if ours.Mean >= fgd.Mean {
			t.Errorf("tessera %.2f is not below fgd %.2f", ours.Mean, fgd.Mean)
		}
	})
	// Our goal: at most 4.0% unallocated GPU at 100% arrived (tessera
	// reaches 3.95 since the routed gap-waste model); see docs/sim.md.
	t.Run("tessera goal", func(t *testing.T) {
		if ours.Mean > tesseraGoal {
			t.Errorf("tessera unallocated@100 %.2f ± %.2f, goal <= %.1f", ours.Mean, ours.SD, tesseraGoal)
		}
	})
}

// TestReproVariants checks, on every trace variant, that FGD and BestFit
// reproduce their published curves and that tessera beats FGD.
func TestReproVariants(t *testing.T) {
	published := publishedTB(t)
	for _, w := range []string{"gpushare40", "gpushare80", "multigpu50", "cpu050", "cpu200", "gpuspec33"} {
		t.Run(w, func(t *testing.T) {
			got := runGrid(t, w, []string{"bestfit", "fgd", "tessera"})
			checkExact(t, published, w, got["bestfit"])
			checkExact(t, published, w, got["fgd"])
			fgd, ours := unallocAt100(t, got["fgd"]), unallocAt100(t, got["tessera"])
			t.Logf("%s: fgd %.2f ± %.2f, tessera %.2f ± %.2f", w, fgd.Mean, fgd.SD, ours.Mean, ours.SD)
			if ours.Mean >= fgd.Mean {
				t.Errorf("%s: tessera %.2f is not below fgd %.2f", w, ours.Mean, fgd.Mean)
			}
		})
	}
}

// TestReproRandomVariants checks the random baseline statistically on the
// variants (its per-seed curves depend on goroutine scheduling in the
// artifact and cannot match exactly).
func TestReproRandomVariants(t *testing.T) {
	pub := PublishedAt100(publishedTB(t))
	for _, w := range []string{"gpushare40", "multigpu50", "cpu200"} {
		got := runGrid(t, w, []string{"random"})
		s := unallocAt100(t, got["random"])
		ps := pub[[2]string{"openb_pod_list_" + w, "random"}]
		t.Logf("%s random: %.2f ± %.2f (published %.2f ± %.2f)", w, s.Mean, s.SD, ps.Mean, ps.SD)
		if tol := 3*ps.SD + 0.5; s.Mean < ps.Mean-tol || s.Mean > ps.Mean+tol {
			t.Errorf("%s random: %.2f, published %.2f ± %.2f", w, s.Mean, ps.Mean, ps.SD)
		}
	}
}
