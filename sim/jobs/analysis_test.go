package jobs

import (
	"cmp"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestTraceAnalysis compares two replays of one trace job by job, for the
// per-trace analysis of docs/gang-quota.md. It runs only when
// TESSERA_ITP_TRACE names a trace:
//
//	TESSERA_ITP_TRACE=../../../shared/traces/microsoft-itp/cluster06.csv \
//	TESSERA_ITP_A=reserve TESSERA_ITP_B=reserve:min=100000 \
//	go test ./sim/jobs -run TestTraceAnalysis -v
//
// A and B are a strategy, then settings of strategy reserve as key=value
// pairs separated by commas: min, wait, rel, share, max, est (an estimate
// model), sf (short-first), pre, easy, cons. It prints both results, the
// big jobs (>= BigGangGPUs) with the longest completion times under A, and
// the days of submission where A's completion times add the most over B's
// (and the completion times of job TESSERA_ITP_JOB, when set).
func TestTraceAnalysis(t *testing.T) {
	path := os.Getenv("TESSERA_ITP_TRACE")
	if path == "" {
		t.Skip("TESSERA_ITP_TRACE is not set")
	}
	trace, err := ReadTrace(path)
	if err != nil {
		t.Fatal(err)
	}
	nodes := 16
	if v := os.Getenv("TESSERA_ITP_NODES"); v != "" {
		if nodes, err = strconv.Atoi(v); err != nil {
			t.Fatal(err)
		}
	}
	runOne := func(spec string) (*Result, string) {
		cfg, err := analysisConfig(spec, nodes)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		r, err := Run(trace, cfg)
		if err != nil {
			t.Fatal(err)
		}
		return r, fmt.Sprintf("%-40s mean %.2f h  max big %.1f h  evictions %d  lost %.0f GPU-h  cons %d  (%s)", spec, r.MeanJCTHours, r.MaxBigGangJCTHours, r.Evictions, r.LostGPUHours, r.ConsolidationMoves, time.Since(start).Round(time.Second))
	}
	specA, specB := cmp.Or(os.Getenv("TESSERA_ITP_A"), "reserve"), cmp.Or(os.Getenv("TESSERA_ITP_B"), "reserve:min=100000")
	a, la := runOne(specA)
	b, lb := runOne(specB)
	t.Log("A: " + la)
	t.Log("B: " + lb)
	first := trace[0].Submit
	byID := map[string]Job{}
	var big []Job
	for _, j := range trace {
		byID[j.ID] = j
		if j.GPUs >= BigGangGPUs {
			big = append(big, j)
		}
	}
	slices.SortFunc(big, func(x, y Job) int { return cmp.Compare(a.jctByID[y.ID], a.jctByID[x.ID]) })
	var sb strings.Builder
	fmt.Fprintf(&sb, "big jobs by JCT under A (of %d):\n%-38s %5s %8s %9s %9s %9s\n", len(big), "id", "GPUs", "dur h", "submit h", "JCT A h", "JCT B h")
	for _, j := range big[:min(len(big), 12)] {
		fmt.Fprintf(&sb, "%-38s %5d %8.1f %9.1f %9.1f %9.1f\n", j.ID, j.GPUs, float64(j.Duration)/3600, float64(j.Submit-first)/3600, float64(a.jctByID[j.ID])/3600, float64(b.jctByID[j.ID])/3600)
	}
	t.Log(sb.String())
	if id := os.Getenv("TESSERA_ITP_JOB"); id != "" {
		t.Logf("job %s: JCT A %.1f h, B %.1f h", id, float64(a.jctByID[id])/3600, float64(b.jctByID[id])/3600)
	}
	type day struct {
		day         int
		jobs        int
		diff, diffB float64 // job-hours A - B, of all jobs and of big ones
	}
	days := map[int]*day{}
	for id, sa := range a.jctByID {
		j := byID[id]
		d := int((j.Submit - first) / 86400)
		if days[d] == nil {
			days[d] = &day{day: d}
		}
		days[d].jobs++
		diff := float64(sa-b.jctByID[id]) / 3600
		days[d].diff += diff
		if j.GPUs >= BigGangGPUs {
			days[d].diffB += diff
		}
	}
	var ds []*day
	total := 0.0
	for _, d := range days {
		ds = append(ds, d)
		total += d.diff
	}
	slices.SortFunc(ds, func(x, y *day) int { return cmp.Compare(y.diff, x.diff) })
	sb.Reset()
	fmt.Fprintf(&sb, "A - B in job-hours: %.0f in all (%.2f h per job); by day of submission, largest first:\n%4s %6s %12s %12s\n", total, total/float64(len(a.jctByID)), "day", "jobs", "A-B job-h", "of big jobs")
	for _, d := range ds[:min(len(ds), 12)] {
		fmt.Fprintf(&sb, "%4d %6d %12.0f %12.0f\n", d.day, d.jobs, d.diff, d.diffB)
	}
	t.Log(sb.String())
}

// analysisConfig parses TestTraceAnalysis's replay spec.
func analysisConfig(spec string, nodes int) (Config, error) {
	cfg := DefaultConfig()
	// As tessera-sim jobs: no quota, no hold (gang is pure backfill).
	cfg.Nodes, cfg.Teams, cfg.SampleEvery, cfg.MaxBackfillWait = nodes, 0, 0, 0
	name, settings, _ := strings.Cut(spec, ":")
	cfg.Strategy = Strategy(name)
	if settings == "" {
		return cfg, nil
	}
	p := &cfg.Reserve
	for _, kv := range strings.Split(settings, ",") {
		k, v, _ := strings.Cut(kv, "=")
		var err error
		switch k {
		case "min":
			p.MinGPUs, err = strconv.Atoi(v)
		case "max":
			p.Max, err = strconv.Atoi(v)
		case "cons":
			cfg.ConsolidateMovesPerMinute, err = strconv.Atoi(v)
		case "wait":
			p.Wait, err = time.ParseDuration(v)
		case "rel":
			p.Relative, err = strconv.ParseFloat(v, 64)
		case "overdue":
			p.OverdueFirst, err = strconv.ParseBool(v)
		case "backlog":
			p.Backlog, err = strconv.ParseFloat(v, 64)
		case "share":
			p.MaxShare, err = strconv.ParseFloat(v, 64)
		case "sf":
			p.ShortFirst, err = strconv.ParseBool(v)
		case "pre":
			p.Preemptible, err = strconv.ParseBool(v)
		case "easy":
			p.Estimates, err = strconv.ParseBool(v)
		case "est":
			cfg.Estimates, err = ParseEstimates(v)
		default:
			err = fmt.Errorf("unknown setting %q", k)
		}
		if err != nil {
			return cfg, fmt.Errorf("%s: %w", kv, err)
		}
	}
	return cfg, nil
}
