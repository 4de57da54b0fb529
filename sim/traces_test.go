package sim

import (
	"os"
	"path/filepath"
	"testing"
)

// traceDir locates the Alibaba GPU trace next to the module
// (../shared/traces/alibaba-gpu-v2023 from the module root). When it is
// missing the test fails under CI=true and is skipped otherwise.
func traceDir(tb testing.TB) string {
	tb.Helper()
	wd, err := os.Getwd()
	if err != nil {
		tb.Fatal(err)
	}
	root := wd
	for {
		if _, err := os.Stat(filepath.Join(root, "go.mod")); err == nil {
			break
		}
		parent := filepath.Dir(root)
		if parent == root {
			tb.Fatalf("no go.mod above %s", wd)
		}
		root = parent
	}
	dir := filepath.Join(root, "..", "shared", "traces", "alibaba-gpu-v2023")
	if _, err := os.Stat(filepath.Join(dir, "openb_node_list_gpu_node.csv")); err != nil {
		if os.Getenv("CI") == "true" {
			tb.Fatalf("the Alibaba GPU trace is missing at %s and CI=true: %v", dir, err)
		}
		tb.Skipf("the Alibaba GPU trace is not at %s (%v); skipping (under CI=true this fails)", dir, err)
	}
	return dir
}

func loadTraceTB(tb testing.TB, workload string) *Trace {
	tb.Helper()
	dir := traceDir(tb)
	tr, err := LoadTrace(filepath.Join(dir, "openb_node_list_gpu_node.csv"), filepath.Join(dir, "openb_pod_list_"+workload+".csv"))
	if err != nil {
		tb.Fatal(err)
	}
	return tr
}

func publishedTB(tb testing.TB) []PublishedCurve {
	tb.Helper()
	curves, err := LoadPublished(filepath.Join(traceDir(tb), "expected", "analysis_allo_discrete.csv"))
	if err != nil {
		tb.Fatal(err)
	}
	return curves
}

// curveDiff compares a simulated curve with a published one: it returns
// the number of arrived percentages that differ and the largest difference.
func curveDiff(tb testing.TB, got []Point, want map[int]float64) (n int, maxDiff float64) {
	tb.Helper()
	if len(got) != len(want) {
		tb.Errorf("simulated curve has %d points, published %d", len(got), len(want))
	}
	for _, p := range got {
		w, ok := want[p.ArrivedPct]
		if !ok {
			tb.Errorf("published curve has no point at %d%%", p.ArrivedPct)
			continue
		}
		if d := p.AllocPct - w; d != 0 {
			n++
			if d < 0 {
				d = -d
			}
			maxDiff = max(maxDiff, d)
		}
	}
	return n, maxDiff
}

func findPublished(curves []PublishedCurve, workload, policy string, seed int64) map[int]float64 {
	for _, c := range curves {
		if c.Workload == workload && c.Policy == policy && c.Seed == seed {
			return c.Alloc
		}
	}
	return nil
}
