package main

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tessera-gpu/tessera/sim"
)

// TestTraceSamples is a second protocol for placement policies, next to
// tessera-sim's (the FGD artifact's: pods drawn with replacement up to
// 1.3x the capacity of the trace's 1213 nodes, in random order). For each
// pod list it draws trace-replay samples as `make bench-peers
// BENCH_PEERS_WORKLOADS=trace` does (2000 pods without replacement, in
// creation order, on a cluster of the trace's node types sized to their
// GPU request) and replays them with the simulated policies of the report
// (bestfit, fgd, tessera as sim.Run builds them), printing each one's mean
// unallocated GPU % over the seeds and on how many seeds tessera beats
// fgd; it fails when tessera's mean is not below fgd's. A change to the tessera policy that helps under one protocol only
// is a fit to it: the node-class pressure tried on 2026-11-24
// (docs/sim.md, "Node classes") won on multigpu50 under tessera-sim and
// lost by 1.6 points here.
//
// It runs only when TESSERA_TRACE_SAMPLES is set: to the pod lists to
// replay (comma-separated names in the trace directory, e.g.
// openb_pod_list_default.csv), or to "all" for every openb_pod_list_*.csv.
// TESSERA_TRACE_SAMPLE_SEEDS is the number of seeds from 42 (default 20).
//
//	TESSERA_TRACE_SAMPLES=all go test ./bench -run TestTraceSamples -v
func TestTraceSamples(t *testing.T) {
	which := os.Getenv("TESSERA_TRACE_SAMPLES")
	if which == "" {
		t.Skip("TESSERA_TRACE_SAMPLES is not set: this is a measurement, run on request")
	}
	seeds := 20
	if v := os.Getenv("TESSERA_TRACE_SAMPLE_SEEDS"); v != "" {
		if _, err := fmt.Sscan(v, &seeds); err != nil || seeds < 1 {
			t.Fatalf("TESSERA_TRACE_SAMPLE_SEEDS=%q is not a positive number", v)
		}
	}
	dir := traceDirTB(t)
	var lists []string
	if which == "all" {
		m, err := filepath.Glob(filepath.Join(dir, "openb_pod_list_*.csv"))
		if err != nil || len(m) == 0 {
			t.Fatalf("no pod lists in %s: %v", dir, err)
		}
		for _, p := range m {
			lists = append(lists, filepath.Base(p))
		}
	} else {
		lists = strings.Split(which, ",")
	}
	policies := simPolicies()[:3] // bestfit, fgd, tessera: the trace's own shapes
	for _, list := range lists {
		tr, err := sim.LoadTrace(filepath.Join(dir, "openb_node_list_gpu_node.csv"), filepath.Join(dir, strings.TrimSpace(list)))
		if err != nil {
			t.Fatal(err)
		}
		sum := make([]float64, len(policies))
		sq := make([]float64, len(policies))
		wins := 0
		for seed := int64(42); seed < 42+int64(seeds); seed++ {
			s, err := sampleTrace(tr, 2000, seed)
			if err != nil {
				t.Fatal(err)
			}
			got := make([]float64, len(policies))
			for i, sp := range policies {
				o, err := sp.simulate(s)
				if err != nil {
					t.Fatal(err)
				}
				got[i] = o.point.UnallocatedPct
				sum[i] += got[i]
				sq[i] += got[i] * got[i]
			}
			if got[2] < got[1] {
				wins++
			}
		}
		var b strings.Builder
		means := make([]float64, len(policies))
		for i, sp := range policies {
			mean := sum[i] / float64(seeds)
			means[i] = mean
			sd := math.Sqrt(math.Max(0, sq[i]/float64(seeds)-mean*mean))
			fmt.Fprintf(&b, "  %s %.2f ± %.2f", sp.name, mean, sd)
		}
		t.Logf("%s, %d samples:%s; tessera below fgd on %d", tr.Workload, seeds, b.String(), wins)
		if means[2] >= means[1] {
			t.Errorf("%s: tessera's mean %.2f %% is not below fgd's %.2f %%", tr.Workload, means[2], means[1])
		}
	}
}
