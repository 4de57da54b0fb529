package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/tessera-gpu/tessera/allocator/mig"
	"github.com/tessera-gpu/tessera/sim"
)

// migCommand replays the Alibaba trace on MIG GPUs (tessera-sim mig ...).
const migCommand = "mig"

type migOptions struct {
	nodes, pods, policies, seeds, model, plot, tieBreak string
	baseline                                            string
	workers                                             int
	ratio                                               float64
	quiet                                               bool
}

func parseMIGFlags(args []string, stderr io.Writer) (*migOptions, error) {
	o := &migOptions{}
	fs := flag.NewFlagSet("tessera-sim mig", flag.ContinueOnError)
	fs.SetOutput(stderr)
	traceFlags(fs, &o.nodes, &o.pods, &o.seeds)
	fs.StringVar(&o.policies, "policy", strings.Join(sim.MIGPolicies(), ","), "comma-separated MIG policies: "+strings.Join(sim.MIGPolicies(), ", "))
	fs.StringVar(&o.baseline, "baseline", "fgd", "non-MIG policies replayed on the same traces and seeds for comparison (table and plot); empty for none")
	fs.StringVar(&o.model, "mig-model", sim.DefaultMIGModel, "MIG geometry of every GPU: "+strings.Join(mig.Models(), ", "))
	fs.IntVar(&o.workers, "workers", 1, "simulations run in parallel")
	fs.StringVar(&o.plot, "plot", "", "write an SVG plot of unplaced GPU demand % vs arrived workload to this file")
	fs.StringVar(&o.tieBreak, "tie-break", "artifact", "node order: artifact (seed-permuted node names) or name")
	fs.Float64Var(&o.ratio, "ratio", sim.DefaultRatio, "workload size as a multiple of the cluster's GPU capacity")
	fs.BoolVar(&o.quiet, "quiet", false, "no progress on stderr")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: tessera-sim mig --nodes NODES.csv --pods PODS.csv[,PODS2.csv] [flags]")
		fmt.Fprintln(stderr, "Replays the trace on GPUs in dynamic MIG mode: sharing pods get the smallest covering profile, whole-GPU pods 7g (docs/sim.md, MIG).")
		fs.PrintDefaults()
	}
	if err := parseTraceFlags(fs, args, &o.nodes, &o.pods); err != nil {
		return nil, err
	}
	switch {
	case o.workers < 1:
		return nil, fmt.Errorf("--workers %d: want at least 1", o.workers)
	case o.ratio <= 0:
		return nil, fmt.Errorf("--ratio %v: want > 0", o.ratio)
	}
	if _, ok := mig.Lookup(o.model); !ok {
		return nil, fmt.Errorf("--mig-model %q: known: %s", o.model, strings.Join(mig.Models(), ", "))
	}
	return o, nil
}

func runMIG(args []string, stdout, stderr io.Writer) error {
	o, err := parseMIGFlags(args, stderr)
	if err != nil {
		return err
	}
	var policies []string
	for _, p := range strings.Split(o.policies, ",") {
		if p = strings.ToLower(strings.TrimSpace(p)); p == "" {
			continue
		}
		known := false
		for _, k := range sim.MIGPolicies() {
			known = known || k == p
		}
		if !known {
			return fmt.Errorf("--policy: unknown MIG policy %q (known: %s)", p, strings.Join(sim.MIGPolicies(), ", "))
		}
		policies = append(policies, p)
	}
	if len(policies) == 0 {
		return fmt.Errorf("--policy: no policy in %q", o.policies)
	}
	var baseline []string
	if strings.TrimSpace(o.baseline) != "" {
		if baseline, err = sim.ParsePolicies(o.baseline); err != nil {
			return fmt.Errorf("--baseline: %w", err)
		}
	}
	seeds, err := sim.ParseSeeds(o.seeds)
	if err != nil {
		return fmt.Errorf("--seeds: %w", err)
	}
	tie, err := sim.ParseTieBreak(o.tieBreak)
	if err != nil {
		return fmt.Errorf("--tie-break: %w", err)
	}
	traces, err := loadTraces(o.nodes, o.pods)
	if err != nil {
		return err
	}
	jobs := sim.MIGJobs(traces, policies, seeds, sim.MIGConfig{Model: o.model, Plan: sim.PlanOptions{Ratio: o.ratio, TieBreak: tie}})
	start := time.Now()
	var progress func(done, total int, r *sim.MIGResult)
	if !o.quiet {
		progress = func(done, total int, r *sim.MIGResult) {
			fmt.Fprintf(stderr, "[%d/%d %s] %s mig-%s seed %d: %d/%d GPU pods placed\n",
				done, total, time.Since(start).Round(time.Second), r.Workload, r.Policy, r.Seed, r.GPUPlaced, r.GPUPods)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	results, err := sim.RunMIGAll(ctx, jobs, o.workers, progress)
	if err != nil {
		return err
	}
	var base []*sim.Result
	if len(baseline) > 0 {
		bjobs := sim.Jobs(traces, baseline, seeds, sim.Config{Plan: sim.PlanOptions{Ratio: o.ratio, TieBreak: tie}})
		var bprogress sim.Progress
		if !o.quiet {
			bprogress = func(done, total int, r *sim.Result) {
				fmt.Fprintf(stderr, "[baseline %d/%d %s] %s %s seed %d: %d/%d pods placed\n",
					done, total, time.Since(start).Round(time.Second), r.Workload, r.Policy, r.Seed, r.Placed, r.Pods)
			}
		}
		if base, err = sim.RunAll(ctx, bjobs, o.workers, bprogress); err != nil {
			return err
		}
	}
	if !o.quiet {
		fmt.Fprintf(stderr, "%d simulations in %s\n", len(results)+len(base), time.Since(start).Round(time.Millisecond))
	}
	sums := sim.SummarizeMIG(results)
	out := bufio.NewWriter(stdout)
	if err := writeMIGTable(out, sums, base, o.model); err != nil {
		return err
	}
	if err := out.Flush(); err != nil {
		return fmt.Errorf("write output: %w", err)
	}
	if o.plot != "" {
		// WriteSVG groups by workload: each one's MIG lines, then its
		// non-MIG ones.
		var plain []sim.Summary
		for _, s := range sums {
			plain = append(plain, s.Summary())
		}
		for _, b := range sim.Summarize(base) {
			b.Policy += " (no MIG)"
			plain = append(plain, b)
		}
		if err := writePlot(o.plot, plain); err != nil {
			return err
		}
	}
	return nil
}

// writeMIGTable writes, per workload, one row per MIG policy: the unplaced
// GPU demand and the idle MIG compute at 100% arrived, the pods and GPU
// pods placed by the end, and the mean instances per profile; then a row
// per non-MIG baseline policy (its unallocated GPU % is both the unplaced
// demand and the idle compute).
func writeMIGTable(w io.Writer, sums []sim.MIGSummary, base []*sim.Result, model string) error {
	type bstat struct {
		unalloc, pods sim.Stats
	}
	var border []string
	bstats := make(map[string]map[string]bstat) // workload -> policy
	for _, bs := range sim.Summarize(base) {
		var pods []float64
		for _, r := range base {
			if r.Workload == bs.Workload && r.Policy == bs.Policy && r.Pods > 0 {
				pods = append(pods, 100*float64(r.Placed)/float64(r.Pods))
			}
		}
		if bstats[bs.Workload] == nil {
			bstats[bs.Workload] = make(map[string]bstat)
		}
		bstats[bs.Workload][bs.Policy] = bstat{bs.Unallocated, sim.MeanSD(pods)}
		if len(bstats) == 1 {
			border = append(border, bs.Policy)
		}
	}
	flush := func(tw io.Writer, workload string) {
		for _, p := range border {
			b, ok := bstats[workload][p]
			if !ok {
				continue
			}
			fmt.Fprintf(tw, "%s (no MIG)\t%.2f ± %.2f\t%.2f ± %.2f\t%.2f ± %.2f\t-\t-\n", p, b.unalloc.Mean, b.unalloc.SD, b.unalloc.Mean, b.unalloc.SD, b.pods.Mean, b.pods.SD)
		}
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	workload := ""
	for _, s := range sums {
		if s.Workload != workload {
			if workload != "" {
				flush(tw, workload)
				fmt.Fprintln(tw)
			}
			workload = s.Workload
			fmt.Fprintf(tw, "workload %s on %s MIG, %d seeds\n", s.Workload, model, len(s.Seeds))
			fmt.Fprintln(tw, "policy\tunplaced demand %@100 (mean ± sd)\tidle compute %@100\tpods placed %@130\tGPU pods placed %@130\tinstances per profile (mean)")
		}
		names := make([]string, 0, len(s.Profiles))
		for n := range s.Profiles {
			names = append(names, n)
		}
		sort.Slice(names, func(i, j int) bool {
			ci, _, _ := mig.ParseProfile(names[i])
			cj, _, _ := mig.ParseProfile(names[j])
			if ci != cj {
				return ci < cj
			}
			return names[i] < names[j]
		})
		var prof []string
		for _, n := range names {
			prof = append(prof, fmt.Sprintf("%s:%.0f", n, s.Profiles[n]))
		}
		fmt.Fprintf(tw, "mig-%s\t%.2f ± %.2f\t%.2f ± %.2f\t%.2f ± %.2f\t%.2f ± %.2f\t%s\n", s.Policy,
			s.Unplaced.Mean, s.Unplaced.SD, s.Idle.Mean, s.Idle.SD, s.PodsPlaced.Mean, s.PodsPlaced.SD, s.GPUPodsPlaced.Mean, s.GPUPodsPlaced.SD, strings.Join(prof, " "))
	}
	if workload != "" {
		flush(tw, workload)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write table: %w", err)
	}
	return nil
}
