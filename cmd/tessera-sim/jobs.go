package main

import (
	"encoding/csv"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/tessera-gpu/tessera/allocator"
	"github.com/tessera-gpu/tessera/allocator/queue"
	"github.com/tessera-gpu/tessera/allocator/reserve"
	"github.com/tessera-gpu/tessera/sim/jobs"
)

// jobsCommand replays training-job traces (tessera-sim jobs ...).
const jobsCommand = "jobs"

type jobsOptions struct {
	traces       string
	nodes        int
	gpusPerNode  int
	strategies   string
	policy       string
	teams        int
	holdAfter    time.Duration
	reclaimAfter time.Duration
	sampleEvery  time.Duration
	format       string
	series       string
	queueTeams   int
	queueDepts   int
	queueGuar    float64
	queueHalf    time.Duration
	queueHistWt  float64
	teamShares   bool
	reserve      reserve.Policy
	estimates    []jobs.Estimates
	consolidate  int
	elasticMin   float64
}

func parseJobsFlags(args []string, stderr io.Writer) (*jobsOptions, error) {
	fs := flag.NewFlagSet("tessera-sim jobs", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := &jobsOptions{}
	def := jobs.DefaultConfig()
	fs.StringVar(&o.traces, "trace", "", "comma-separated job trace CSVs (job_id, submission_time, duration, num_gpu), e.g. ../shared/traces/microsoft-itp/cluster01.csv")
	fs.IntVar(&o.nodes, "nodes", def.Nodes, "nodes in the simulated cluster")
	fs.IntVar(&o.gpusPerNode, "gpus-per-node", def.GPUsPerNode, "GPUs per node (NVSwitch-connected)")
	fs.StringVar(&o.strategies, "strategy", "gang,nogang,fifo", "comma-separated strategies: gang (Tessera), nogang, fifo, queues (hierarchical queues with fair share by usage history), reserve (gang with a reservation for a starving big job, --reserve-*)")
	fs.StringVar(&o.policy, "policy", def.Policy, "node policy: "+strings.Join(allocator.PolicyNames(), ", "))
	fs.IntVar(&o.teams, "teams", 0, "spread jobs over this many namespaces with ElasticQuota min=capacity/teams, max=capacity (gang only); 0: no quota")
	fs.DurationVar(&o.holdAfter, "hold-after", 0, "gang: hold draining nodes for a blocked job once it has waited this long (0: never, pure backfill)")
	fs.DurationVar(&o.reclaimAfter, "reclaim-after", 0, "gang with --teams: wait this long before evicting borrowed jobs for a job within its min")
	fs.DurationVar(&o.sampleEvery, "sample-every", time.Hour, "period of the utilisation series")
	fs.StringVar(&o.format, "format", "table", "table or json (one object per trace and strategy)")
	fs.StringVar(&o.series, "series", "", "write GPU use over time (trace, strategy, hours, running, held) as CSV to this file")
	fs.IntVar(&o.queueTeams, "queue-teams", 0, "teams (leaf queues) of the queues strategy and of every strategy's fairness metric, jobs spread by a hash of the ID; 0: --teams, or 4 when that is 0")
	fs.IntVar(&o.queueDepts, "queue-departments", 2, "departments (parent queues) the teams alternate between")
	fs.Float64Var(&o.queueGuar, "queue-guarantee-fraction", 1, "queues: each team guarantees floor(cluster GPUs x this / teams)")
	fs.DurationVar(&o.queueHalf, "queue-half-life", jobs.DefaultQueueHalfLife, "queues: half-life of the decayed usage history that orders the teams")
	fs.Float64Var(&o.queueHistWt, "queue-history-weight", queue.DefaultHistoryWeight, "queues: how much a team's recent borrowing lowers its part of what is lent (0: by weight alone)")
	fs.IntVar(&o.reserve.MinGPUs, "reserve-min-gpus", def.Reserve.MinGPUs, "reserve: jobs of fewer GPUs never get a reservation")
	fs.DurationVar(&o.reserve.Wait, "reserve-wait", def.Reserve.Wait, "reserve: a big job is due a reservation after waiting this long, plus --reserve-wait-per-gpu per GPU")
	fs.DurationVar(&o.reserve.WaitPerGPU, "reserve-wait-per-gpu", def.Reserve.WaitPerGPU, "reserve: added to --reserve-wait per GPU of the job")
	fs.BoolVar(&o.reserve.Preemptible, "reserve-preemptible", def.Reserve.Preemptible, "reserve: other jobs may start on held GPUs and are evicted when the reservation fills (false: held GPUs stay idle)")
	fs.Float64Var(&o.reserve.Relative, "reserve-relative", def.Reserve.Relative, "reserve: add this many times the wait of the longest-waiting job smaller than --reserve-min-gpus to a big job's due wait")
	fs.IntVar(&o.reserve.Max, "reserve-max", def.Reserve.Max, "reserve: jobs holding reservations at once, on disjoint nodes")
	fs.BoolVar(&o.reserve.ByAge, "reserve-by-age", def.Reserve.ByAge, "reserve: hold the nodes whose longest-running pod is youngest first (else the fewest GPUs to drain first)")
	fs.BoolVar(&o.reserve.Estimates, "reserve-estimates", def.Reserve.Estimates, "reserve: EASY backfill by declared run times (--estimates): hold the nodes that drain first, and let a job that ends before the reservation starts backfill on held GPUs")
	fs.BoolVar(&o.reserve.ShortFirst, "reserve-short-first", def.Reserve.ShortFirst, "reserve: try waiting jobs by response ratio ((waited + declared run time) / declared run time) instead of in arrival order")
	fs.Float64Var(&o.reserve.MaxShare, "reserve-max-share", def.Reserve.MaxShare, "reserve: no new reservation while jobs of --reserve-min-gpus or more run on more than this share of the GPUs (0: no cap)")
	fs.DurationVar(&o.reserve.Undeclared, "reserve-undeclared", def.Reserve.Undeclared, "reserve: with --reserve-short-first, the run time assumed for a job that declares none (0: 720h)")
	fs.BoolVar(&o.reserve.OverdueFirst, "reserve-overdue-first", def.Reserve.OverdueFirst, "reserve: a free reservation slot goes to the most overdue due job (waited minus its due wait), not the first due job in queue order")
	fs.Float64Var(&o.reserve.Backlog, "reserve-backlog", def.Reserve.Backlog, "reserve: add this many times the job's backlog wait (the work ahead of it when it arrived, by declared run times, over the cluster's GPUs) to its due wait")
	fs.IntVar(&o.consolidate, "consolidate-moves-per-minute", 0, "reserve: consolidation: a job holding a reservation that cannot start gets whole nodes by moving running one-pod jobs smaller than a node (each restarts, its work lost), at most this many per minute of simulated time (0: off)")
	fs.Float64Var(&o.elasticMin, "elastic-min", 0, "gang, queues, reserve: every job of several pods that the trace gives no min_gpu column for is an elastic gang that starts with this fraction of its pods (rounded up) and grows one pod at a time as room appears; 0: rigid jobs")
	estimates := fs.String("estimates", def.Estimates.String(), "reserve: comma-separated models of the run time jobs declare, one replay each: none, oracle (the actual duration), user<factor>x-miss<share> (actual x factor rounded up to a limit class of 1h..30d; that share of jobs declares none)")
	reserveOrder := fs.String("reserve-order", string(def.Reserve.Order), "reserve: tie-break between nodes with as many GPUs to drain: youngest, oldest (by their longest-running pod) or name")
	fs.BoolVar(&o.teamShares, "team-shares", false, "table: also print each team's received and entitled GPU-hours while it waited")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	o.reserve.Order = reserve.Order(*reserveOrder)
	for _, e := range strings.Split(*estimates, ",") {
		m, err := jobs.ParseEstimates(strings.TrimSpace(e))
		if err != nil {
			return nil, fmt.Errorf("jobs: --estimates: %w", err)
		}
		o.estimates = append(o.estimates, m)
	}
	if o.elasticMin < 0 || o.elasticMin > 1 {
		return nil, fmt.Errorf("jobs: --elastic-min %v: want a fraction of a job's pods, 0..1 (0: rigid jobs)", o.elasticMin)
	}
	if o.consolidate < 0 {
		return nil, fmt.Errorf("jobs: --consolidate-moves-per-minute %d: want 0 (off) or more", o.consolidate)
	}
	if err := o.reserve.Validate(); err != nil {
		return nil, fmt.Errorf("jobs: %w", err)
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("jobs: unexpected arguments %q", fs.Args())
	}
	if o.queueGuar <= 0 || o.queueGuar > 1 {
		return nil, fmt.Errorf("jobs: --queue-guarantee-fraction %v: want above 0, at most 1", o.queueGuar)
	}
	if !(o.queueHistWt >= 0) || math.IsInf(o.queueHistWt, 0) {
		return nil, fmt.Errorf("jobs: --queue-history-weight %v: want 0 or more", o.queueHistWt)
	}
	if o.queueHalf <= 0 {
		return nil, fmt.Errorf("jobs: --queue-half-life %v: want above 0", o.queueHalf)
	}
	if o.queueDepts < 1 || o.queueTeams < 0 {
		return nil, fmt.Errorf("jobs: --queue-departments %d, --queue-teams %d: want at least 1 department and 0 or more teams", o.queueDepts, o.queueTeams)
	}
	if o.traces == "" {
		return nil, fmt.Errorf("jobs: --trace is required")
	}
	if o.format != "table" && o.format != "json" {
		return nil, fmt.Errorf("jobs: --format %q: want table or json", o.format)
	}
	return o, nil
}

// jobsRow is one trace and strategy's result.
type jobsRow struct {
	Trace   string `json:"trace"`
	Variant string `json:"variant"`
	Nodes   int    `json:"nodes"`
	*jobs.Result
}

func runJobs(args []string, stdout, stderr io.Writer) error {
	o, err := parseJobsFlags(args, stderr)
	if err != nil {
		return err
	}
	var strategies []jobs.Strategy
	for _, s := range strings.Split(o.strategies, ",") {
		strategies = append(strategies, jobs.Strategy(strings.TrimSpace(s)))
	}
	var rows []jobsRow
	for _, path := range strings.Split(o.traces, ",") {
		path = strings.TrimSpace(path)
		trace, err := jobs.ReadTrace(path)
		if err != nil {
			return err
		}
		name := strings.TrimSuffix(filepath.Base(path), filepath.Ext(path))
		for _, run := range expand(strategies, o.estimates, o.reserve.Estimates) {
			st := run.strategy
			cfg := jobs.Config{
				Strategy: st, Nodes: o.nodes, GPUsPerNode: o.gpusPerNode, Policy: o.policy,
				MaxBackfillWait: int64(o.holdAfter / time.Second), ReclaimAfter: int64(o.reclaimAfter / time.Second),
				SampleEvery: int64(o.sampleEvery / time.Second),
				Queues:      jobs.QueueConfig{Teams: o.queueTeams, Departments: o.queueDepts, GuaranteeFraction: o.queueGuar, HalfLife: o.queueHalf, HistoryWeight: histWeight(o.queueHistWt)},
				Reserve:     o.reserve,
				Estimates:   run.estimates,
				ElasticMin:  o.elasticMin,
			}
			if st == jobs.StrategyReserve {
				cfg.ConsolidateMovesPerMinute = o.consolidate
			}
			if o.queueTeams == 0 {
				// The fairness metric's teams are --teams for every
				// strategy, not only gang's quota.
				cfg.Queues.Teams = o.teams
			}
			if st == jobs.StrategyGang {
				cfg.Teams = o.teams
			}
			start := time.Now()
			res, err := jobs.Run(trace, cfg)
			if err != nil {
				return fmt.Errorf("%s, %s: %w", name, st, err)
			}
			fmt.Fprintf(stderr, "%s %s: %d jobs in %s\n", name, st, len(trace), time.Since(start).Round(time.Millisecond))
			rows = append(rows, jobsRow{Trace: name, Variant: variant(cfg), Nodes: o.nodes, Result: res})
		}
	}
	if o.series != "" {
		if err := writeSeries(o.series, rows); err != nil {
			return err
		}
	}
	if o.format == "json" {
		enc := json.NewEncoder(stdout)
		for _, r := range rows {
			series := r.Series
			r.Series = nil
			if err := enc.Encode(r); err != nil {
				return err
			}
			r.Series = series
		}
		return nil
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "trace\tstrategy\tjobs\tfinished\tmean JCT h\tp95 JCT h\tmax JCT h\tmax JCT h >=16 GPUs\tmean queue h\tutil %\tpartial-gang GPU-h\theld idle GPU-h\tevictions\tlost GPU-h\tJain\tmin recv/ent\telastic +/-\t")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%.2f\t%.2f\t%.1f\t%.1f\t%.2f\t%.1f\t%.0f\t%.0f\t%d\t%.0f\t%.3f\t%.3f\t%d/%d\t\n", r.Trace, r.Variant, r.Jobs, r.Finished,
			r.MeanJCTHours, r.P95JCTHours, r.MaxJCTHours, r.MaxBigGangJCTHours, r.MeanQueueHours, r.UtilizationPct, r.WastedGPUHours, r.ReservedIdleGPUHours, r.Evictions, r.LostGPUHours,
			r.Fairness.JainIndex, r.Fairness.MinShareRatio, r.ElasticGrows, r.ElasticShrinks)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if !o.teamShares {
		return nil
	}
	fmt.Fprintln(stdout)
	tw = tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "trace\tstrategy\tteam\twaiting h\treceived GPU-h\tentitled GPU-h\trecv/ent\tused GPU-h\t")
	for _, r := range rows {
		for _, ts := range r.Fairness.Teams {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%.1f\t%.0f\t%.0f\t%.3f\t%.0f\t\n", r.Trace, r.Variant, ts.Team, ts.WaitingHours, ts.ReceivedGPUHours, ts.EntitledGPUHours, ts.Ratio, ts.UsedGPUHours)
		}
	}
	return tw.Flush()
}

// variant names a strategy with its settings, e.g. "gang+quota4".
func variant(cfg jobs.Config) string {
	v := strategyVariant(cfg)
	if cfg.ElasticMin > 0 && cfg.Strategy != jobs.StrategyNoGang && cfg.Strategy != jobs.StrategyFIFO {
		v += "+elastic" + strconv.FormatFloat(cfg.ElasticMin, 'g', -1, 64)
	}
	return v
}

// histWeight is QueueConfig.HistoryWeight for the flag's k: 0 there
// means the default, so off is below 0.
func histWeight(k float64) float64 {
	if k == 0 {
		return -1
	}
	return k
}

func strategyVariant(cfg jobs.Config) string {
	v := string(cfg.Strategy)
	if cfg.Strategy == jobs.StrategyQueues {
		if cfg.Queues.HalfLife != jobs.DefaultQueueHalfLife {
			v += "+hl" + cfg.Queues.HalfLife.String()
		}
		if w := cfg.Queues.HistoryWeight; w != 0 && w != queue.DefaultHistoryWeight {
			v += "+hw" + strconv.FormatFloat(max(w, 0), 'g', -1, 64)
		}
		if f := cfg.Queues.GuaranteeFraction; f != 1 {
			v += "+guar" + strconv.FormatFloat(f, 'g', -1, 64)
		}
		return v
	}
	if cfg.Strategy == jobs.StrategyReserve {
		v += reserveVariant(cfg.Reserve)
		if cfg.ConsolidateMovesPerMinute > 0 {
			v += "+cons" + strconv.Itoa(cfg.ConsolidateMovesPerMinute)
		}
		if cfg.Reserve.Estimates {
			v += "+est=" + cfg.Estimates.String()
		}
		return v
	}
	if cfg.Strategy != jobs.StrategyGang {
		return v
	}
	if cfg.MaxBackfillWait > 0 {
		v += "+hold" + (time.Duration(cfg.MaxBackfillWait) * time.Second).String()
	}
	if cfg.Teams > 0 {
		v += "+quota" + strconv.Itoa(cfg.Teams)
	}
	return v
}

func writeSeries(path string, rows []jobsRow) (err error) {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("--series: %w", err)
	}
	defer func() {
		if cerr := f.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("--series: %w", cerr)
		}
	}()
	w := csv.NewWriter(f)
	if err := w.Write([]string{"trace", "strategy", "hours", "running_gpus", "held_gpus"}); err != nil {
		return err
	}
	for _, r := range rows {
		for _, s := range r.Series {
			rec := []string{r.Trace, r.Variant, strconv.FormatFloat(float64(s.Time)/3600, 'f', 2, 64), strconv.Itoa(s.Running), strconv.Itoa(s.Held)}
			if err := w.Write(rec); err != nil {
				return err
			}
		}
	}
	w.Flush()
	return w.Error()
}

// reserveVariant names the reservation settings that differ from the
// defaults, e.g. "+w6h0m0s+pre".
func reserveVariant(p reserve.Policy) string {
	def := jobs.DefaultReservePolicy()
	v := ""
	if p.MinGPUs != def.MinGPUs {
		v += "+min" + strconv.Itoa(p.MinGPUs)
	}
	if p.Wait != def.Wait {
		v += "+w" + p.Wait.String()
	}
	if p.WaitPerGPU != def.WaitPerGPU {
		v += "+wpg" + p.WaitPerGPU.String()
	}
	if p.Preemptible != def.Preemptible {
		v += "+pre=" + strconv.FormatBool(p.Preemptible)
	}
	if p.Relative != def.Relative {
		v += "+rel" + strconv.FormatFloat(p.Relative, 'g', -1, 64)
	}
	if p.Max != def.Max {
		v += "+max" + strconv.Itoa(p.Max)
	}
	if p.ByAge != def.ByAge {
		v += "+byage=" + strconv.FormatBool(p.ByAge)
	}
	if p.Order != def.Order {
		v += "+" + string(p.Order)
	}
	if p.Estimates != def.Estimates {
		v += "+easy=" + strconv.FormatBool(p.Estimates)
	}
	if p.Undeclared != def.Undeclared {
		v += "+und" + p.Undeclared.String()
	}
	if p.MaxShare != def.MaxShare {
		v += "+share" + strconv.FormatFloat(p.MaxShare, 'g', -1, 64)
	}
	if p.OverdueFirst != def.OverdueFirst {
		v += "+overdue=" + strconv.FormatBool(p.OverdueFirst)
	}
	if p.Backlog != def.Backlog {
		v += "+backlog" + strconv.FormatFloat(p.Backlog, 'g', -1, 64)
	}
	if p.ShortFirst != def.ShortFirst {
		v += "+sf=" + strconv.FormatBool(p.ShortFirst)
	}
	return v
}

// replay is one strategy (and, for reserve with estimates, one estimate
// model) to replay each trace under.
type replay struct {
	strategy  jobs.Strategy
	estimates jobs.Estimates
}

// expand lists the replays: each strategy once, reserve once per estimate
// model when it uses estimates (easy).
func expand(strategies []jobs.Strategy, estimates []jobs.Estimates, easy bool) []replay {
	var out []replay
	for _, st := range strategies {
		if st != jobs.StrategyReserve || !easy {
			out = append(out, replay{strategy: st})
			continue
		}
		for _, e := range estimates {
			out = append(out, replay{strategy: st, estimates: e})
		}
	}
	return out
}
