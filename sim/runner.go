package sim

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/tessera-gpu/tessera/allocator"
)

// Job is one simulation to run: a trace, a policy and a seed.
type Job struct {
	Trace  *Trace
	Config Config
}

// Jobs builds the grid traces x policies x seeds with common options.
func Jobs(traces []*Trace, policies []string, seeds []int64, base Config) []Job {
	var out []Job
	for _, t := range traces {
		for _, p := range policies {
			for _, s := range seeds {
				c := base
				c.Policy = p
				c.Seed = s
				out = append(out, Job{Trace: t, Config: c})
			}
		}
	}
	return out
}

// Progress is told about every finished job (done of total), from the
// goroutine that ran it; calls are serialised.
type Progress func(done, total int, r *Result)

// RunAll runs jobs on `workers` goroutines and returns the results in job
// order. It stops at the first error (or when ctx is cancelled).
func RunAll(ctx context.Context, jobs []Job, workers int, progress Progress) ([]*Result, error) {
	return runParallel(ctx, jobs, workers, func(j Job) (*Result, error) { return Run(j.Trace, j.Config) }, progress)
}

// runParallel runs run on each of jobs on `workers` goroutines and returns
// the results in job order. It stops at the first error or when ctx is
// cancelled. progress, when not nil, is called after each job
// (serialised).
func runParallel[J, R any](ctx context.Context, jobs []J, workers int, run func(J) (R, error), progress func(done, total int, r R)) ([]R, error) {
	if workers < 1 {
		workers = 1
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	results := make([]R, len(jobs))
	next := make(chan int)
	var (
		mu       sync.Mutex
		firstErr error
		done     int
		wg       sync.WaitGroup
	)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				r, err := run(jobs[i])
				mu.Lock()
				if err != nil {
					if firstErr == nil {
						firstErr = err
					}
					cancel()
				} else {
					results[i] = r
					done++
					if progress != nil {
						progress(done, len(jobs), r)
					}
				}
				mu.Unlock()
			}
		}()
	}
feed:
	for i := range jobs {
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	if firstErr != nil {
		return nil, firstErr
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("simulation cancelled: %w", err)
	}
	return results, nil
}

// ParseSeeds parses "42-51", "42,45" or a mix like "42-44,50".
func ParseSeeds(s string) ([]int64, error) {
	var out []int64
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.ParseInt(strings.TrimSpace(lo), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("seed %q: %w", part, err)
		}
		b := a
		if isRange {
			if b, err = strconv.ParseInt(strings.TrimSpace(hi), 10, 64); err != nil {
				return nil, fmt.Errorf("seed range %q: %w", part, err)
			}
			if b < a {
				return nil, fmt.Errorf("seed range %q is reversed", part)
			}
			if b-a > 100000 {
				return nil, fmt.Errorf("seed range %q is too long", part)
			}
		}
		// Stop at b, not past it: v++ past math.MaxInt64 wraps around.
		for v := a; ; v++ {
			out = append(out, v)
			if v == b {
				break
			}
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no seeds in %q", s)
	}
	return out, nil
}

// ParsePolicies splits a comma-separated policy list and checks every name.
func ParsePolicies(s string) ([]string, error) {
	known := make(map[string]bool)
	for _, n := range allocator.PolicyNames() {
		known[n] = true
	}
	var out []string
	for _, p := range strings.Split(s, ",") {
		p = strings.ToLower(strings.TrimSpace(p))
		if p == "" {
			continue
		}
		if !known[p] {
			return nil, fmt.Errorf("%w %q (known: %s)", allocator.ErrUnknownPolicy, p, strings.Join(allocator.PolicyNames(), ", "))
		}
		out = append(out, p)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no policy in %q", s)
	}
	return out, nil
}

// Summary aggregates the runs of one workload and policy over seeds.
type Summary struct {
	Workload string
	Policy   string
	Seeds    []int64
	// Curve holds, per arrived percentage, the mean over seeds.
	Curve []Point
	// Unallocated and Frag are the statistics at 100% arrived.
	Unallocated Stats
	Frag        Stats
}

// runKey names the runs a summary averages over seeds.
type runKey struct{ workload, policy string }

// runGroup is the results of one runKey.
type runGroup[R any] struct {
	key     runKey
	results []R
}

// groupByRun groups results by their key, groups and results in
// first-seen order.
func groupByRun[R any](results []R, key func(R) runKey) []runGroup[R] {
	var out []runGroup[R]
	at := map[runKey]int{}
	for _, r := range results {
		k := key(r)
		i, ok := at[k]
		if !ok {
			i = len(out)
			at[k] = i
			out = append(out, runGroup[R]{key: k})
		}
		out[i].results = append(out[i].results, r)
	}
	return out
}

// Summarize groups results by workload and policy (in first-seen order)
// and computes means and sample standard deviations over seeds.
func Summarize(results []*Result) []Summary {
	groups := groupByRun(results, func(r *Result) runKey { return runKey{r.Workload, r.Policy} })
	out := make([]Summary, 0, len(groups))
	for _, g := range groups {
		rs := g.results
		s := Summary{Workload: g.key.workload, Policy: g.key.policy}
		byPct := make(map[int][]Point)
		var unalloc, frag []float64
		for _, r := range rs {
			s.Seeds = append(s.Seeds, r.Seed)
			for _, p := range r.Curve {
				byPct[p.ArrivedPct] = append(byPct[p.ArrivedPct], p)
			}
			if p, ok := At(r.Curve, 100); ok {
				unalloc = append(unalloc, p.UnallocatedPct)
				frag = append(frag, p.FragPct)
			}
		}
		pcts := make([]int, 0, len(byPct))
		for pct := range byPct {
			pcts = append(pcts, pct)
		}
		sort.Ints(pcts)
		for _, pct := range pcts {
			ps := byPct[pct]
			var m Point
			m.ArrivedPct = pct
			for _, p := range ps {
				m.AllocPct += p.AllocPct
				m.UnallocatedPct += p.UnallocatedPct
				m.FragPct += p.FragPct
			}
			n := float64(len(ps))
			m.AllocPct /= n
			m.UnallocatedPct /= n
			m.FragPct /= n
			s.Curve = append(s.Curve, m)
		}
		s.Unallocated = MeanSD(unalloc)
		s.Frag = MeanSD(frag)
		out = append(out, s)
	}
	return out
}
