// Command tessera-sim replays the Alibaba GPU trace (cluster-trace-gpu-v2023)
// under Tessera's placement policies, following the protocol of the FGD
// paper (USENIX ATC'23) and its artifact. See docs/sim.md.
//
//	tessera-sim --nodes openb_node_list_gpu_node.csv --pods openb_pod_list_default.csv \
//	    --policy random,bestfit,fgd,tessera --seeds 42-51 --workers 2 --format table --plot out.svg
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/tessera-gpu/tessera/allocator"
	"github.com/tessera-gpu/tessera/sim"
)

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "tessera-sim:", err)
		os.Exit(1)
	}
}

type options struct {
	nodes, pods, policies, seeds, format, plot, tieBreak, expected string
	tesseraWeights                                                 string
	workers                                                        int
	ratio                                                          float64
	quiet                                                          bool
}

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("tessera-sim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	traceFlags(fs, &o.nodes, &o.pods, &o.seeds)
	fs.StringVar(&o.policies, "policy", "random,dotprod,gpuclustering,gpupacking,bestfit,fgd,tessera", "comma-separated policies: "+strings.Join(allocator.PolicyNames(), ", "))
	fs.IntVar(&o.workers, "workers", 1, "simulations run in parallel")
	fs.StringVar(&o.format, "format", "table", "output format: table, json or csv")
	fs.StringVar(&o.plot, "plot", "", "write an SVG plot of unallocated GPU % vs arrived workload to this file")
	fs.StringVar(&o.tieBreak, "tie-break", "artifact", "tie-break between equal scores: artifact (the artifact's seed-permuted node names) or name (smallest node name)")
	fs.Float64Var(&o.ratio, "ratio", sim.DefaultRatio, "workload size as a multiple of the cluster's GPU capacity")
	fs.StringVar(&o.expected, "expected", "", "the artifact's published analysis_allo_discrete.csv, to show published values in the table")
	fs.BoolVar(&o.quiet, "quiet", false, "no progress on stderr")
	fs.StringVar(&o.tesseraWeights, "tessera-weights", "", "override the tessera policy's tuning, e.g. strand=4,gap=0.5 (keys frag, strand, gap, gapcomp, gaptau, open, model, scarce, claim, free, rem, priced; others keep their default)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: tessera-sim --nodes NODES.csv --pods PODS.csv[,PODS2.csv] [flags]")
		fmt.Fprintln(stderr, "       tessera-sim jobs|mig|bound ... (each with -h)")
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
	switch o.format {
	case "table", "json", "csv":
	default:
		return nil, fmt.Errorf("--format %q: want table, json or csv", o.format)
	}
	return o, nil
}

func run(args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == jobsCommand {
		return runJobs(args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == migCommand {
		return runMIG(args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == boundCommand {
		return runBound(args[1:], stdout, stderr)
	}
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	policies, err := sim.ParsePolicies(o.policies)
	if err != nil {
		return fmt.Errorf("--policy: %w", err)
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
	var tcfg *allocator.TesseraConfig
	if o.tesseraWeights != "" {
		c, err := sim.ParseTesseraConfig(o.tesseraWeights)
		if err != nil {
			return fmt.Errorf("--tessera-weights: %w", err)
		}
		tcfg = &c
	}
	var published map[[2]string]sim.Stats
	if o.expected != "" {
		curves, err := sim.LoadPublished(o.expected)
		if err != nil {
			return err
		}
		published = sim.PublishedAt100(curves)
	}

	jobs := sim.Jobs(traces, policies, seeds, sim.Config{Plan: sim.PlanOptions{Ratio: o.ratio, TieBreak: tie}, Tessera: tcfg})
	start := time.Now()
	var progress sim.Progress
	if !o.quiet {
		progress = func(done, total int, r *sim.Result) {
			u := "-"
			if p, ok := sim.At(r.Curve, 100); ok {
				u = fmt.Sprintf("%.2f%%", p.UnallocatedPct)
			}
			fmt.Fprintf(stderr, "[%d/%d %s] %s %s seed %d: %d/%d pods placed, unallocated@100 %s\n",
				done, total, time.Since(start).Round(time.Second), r.Workload, r.Policy, r.Seed, r.Placed, r.Pods, u)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	results, err := sim.RunAll(ctx, jobs, o.workers, progress)
	if err != nil {
		return err
	}
	if !o.quiet {
		fmt.Fprintf(stderr, "%d simulations in %s\n", len(results), time.Since(start).Round(time.Millisecond))
	}

	out := bufio.NewWriter(stdout)
	sums := sim.Summarize(results)
	switch o.format {
	case "json":
		err = sim.WriteJSON(out, results)
	case "csv":
		err = sim.WriteCSV(out, results)
	default:
		err = sim.WriteTable(out, sums, published)
	}
	if err != nil {
		return err
	}
	if err := out.Flush(); err != nil {
		return fmt.Errorf("write output: %w", err)
	}
	if o.plot != "" {
		if err := writePlot(o.plot, sums); err != nil {
			return err
		}
	}
	return nil
}

func writePlot(path string, sums []sim.Summary) (err error) {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("plot: %w", err)
	}
	defer func() {
		if cerr := f.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("plot: %w", cerr)
		}
	}()
	w := bufio.NewWriter(f)
	if err := sim.WriteSVG(w, sums); err != nil {
		return fmt.Errorf("plot %s: %w", path, err)
	}
	if err := w.Flush(); err != nil {
		return fmt.Errorf("plot %s: %w", path, err)
	}
	return nil
}

// traceFlags defines the flags every replay of the Alibaba trace takes.
func traceFlags(fs *flag.FlagSet, nodes, pods, seeds *string) {
	fs.StringVar(nodes, "nodes", "", "node list CSV (openb_node_list_gpu_node.csv)")
	fs.StringVar(pods, "pods", "", "pod list CSV(s), comma-separated (openb_pod_list_*.csv)")
	fs.StringVar(seeds, "seeds", "42-51", "seeds, e.g. 42-51 or 42,45")
}

// parseTraceFlags parses args and checks what traceFlags defined: no
// arguments left, a node list and pod lists named. nodes and pods are the
// flags' variables, read after parsing.
func parseTraceFlags(fs *flag.FlagSet, args []string, nodes, pods *string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch {
	case fs.NArg() > 0:
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	case *nodes == "":
		return errors.New("--nodes is required")
	case *pods == "":
		return errors.New("--pods is required")
	}
	return nil
}

// loadTraces reads the node list and each of the comma-separated pod lists
// (one trace per pod list, all on the same nodes).
func loadTraces(nodesPath, podPaths string) ([]*sim.Trace, error) {
	nodes, err := sim.LoadNodes(nodesPath)
	if err != nil {
		return nil, err
	}
	var traces []*sim.Trace
	for _, p := range strings.Split(podPaths, ",") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		pods, err := sim.LoadPods(p)
		if err != nil {
			return nil, err
		}
		traces = append(traces, &sim.Trace{Workload: sim.WorkloadName(p), Nodes: nodes, Pods: pods})
	}
	return traces, nil
}
