package main

import (
	"flag"
	"fmt"
	"io"
	"slices"
	"text/tabwriter"

	"github.com/tessera-gpu/tessera/sim"
	"github.com/tessera-gpu/tessera/sim/bound"
)

// boundCommand bounds the unallocated GPU % any policy can reach
// (tessera-sim bound ...).
const boundCommand = "bound"

type boundOptions struct {
	nodes, pods, seeds string
	pct                int
	ratio              float64
	perSeed            bool
}

func parseBoundFlags(args []string, stderr io.Writer) (*boundOptions, error) {
	o := &boundOptions{}
	fs := flag.NewFlagSet("tessera-sim bound", flag.ContinueOnError)
	fs.SetOutput(stderr)
	traceFlags(fs, &o.nodes, &o.pods, &o.seeds)
	fs.IntVar(&o.pct, "arrived", 100, "arrived workload % at which to bound the unallocated GPU %")
	fs.Float64Var(&o.ratio, "ratio", sim.DefaultRatio, "workload size as a multiple of the cluster's GPU capacity")
	fs.BoolVar(&o.perSeed, "per-seed", false, "a line per seed too")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: tessera-sim bound --nodes NODES.csv --pods PODS.csv[,PODS2.csv] [flags]")
		fmt.Fprintln(stderr, "Bounds from below the unallocated GPU % that any placement policy, online or offline, leaves at an arrived %, with the arrivals of the replay (docs/sim.md, \"A bound for every policy\").")
		fs.PrintDefaults()
	}
	if err := parseTraceFlags(fs, args, &o.nodes, &o.pods); err != nil {
		return nil, err
	}
	switch {
	case o.pct < 1 || o.pct > sim.MaxArrivedPct:
		return nil, fmt.Errorf("--arrived %d: want 1..%d", o.pct, sim.MaxArrivedPct)
	case o.ratio <= 0:
		return nil, fmt.Errorf("--ratio %v: want > 0", o.ratio)
	}
	return o, nil
}

func runBound(args []string, stdout, stderr io.Writer) error {
	o, err := parseBoundFlags(args, stderr)
	if err != nil {
		return err
	}
	seeds, err := sim.ParseSeeds(o.seeds)
	if err != nil {
		return fmt.Errorf("--seeds: %w", err)
	}
	traces, err := loadTraces(o.nodes, o.pods)
	if err != nil {
		return err
	}
	w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "workload\tseeds\tunallocated %% at %d %% arrived, lower bound (mean ± sd)\tmin\tmax\n", o.pct)
	for _, t := range traces {
		var xs []float64
		for _, seed := range seeds {
			b, err := bound.UnallocatedAt(t, seed, sim.PlanOptions{Ratio: o.ratio}, o.pct)
			if err != nil {
				return err
			}
			xs = append(xs, b.UnallocatedPct)
			if o.perSeed {
				fmt.Fprintf(w, "%s\t%d\t%.3f (%d arrivals, %d fillings priced)\t\t\n", t.Workload, seed, b.UnallocatedPct, b.Events, b.Packable.Patterns)
			}
		}
		st := sim.MeanSD(xs)
		fmt.Fprintf(w, "%s\t%s\t%.3f ± %.3f\t%.3f\t%.3f\n", t.Workload, o.seeds, st.Mean, st.SD, slices.Min(xs), slices.Max(xs))
	}
	return w.Flush()
}
