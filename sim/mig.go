package sim

import (
	"context"
	"fmt"
	"math"
	"sort"
	"strings"

	"github.com/tessera-gpu/tessera/allocator"
	"github.com/tessera-gpu/tessera/allocator/mig"
)

// The MIG variant of the trace replay: every GPU of the cluster is a GPU in
// MIG mode of one model's geometry (DefaultMIGModel), partitioned on
// demand (dynamic MIG: an instance is created in a GPU's free memory
// slices when a pod arrives; pods never leave, so no GPU with a tenant is
// ever repartitioned). A sharing pod (a slice of gpu_milli) gets the
// smallest profile that covers its share (mig.Smallest; the trace has no
// GPU memory), a pod of k whole GPUs k fully free GPUs (7g each). Arrivals,
// the workload and the tie-break order are the FGD protocol's (NewPlan).
//
// The policies, from the node down to the placement in the GPU:
//
//   - MIGFirstFit: the first node that fits (in the tie-break order, so a
//     seed-dependent order), its first GPU that can take the profile, the
//     lowest free start.
//   - MIGFrag: the same node; of its GPUs and placements, the one after
//     which the GPU's expected unplaceable demand (mig.Meter over the
//     trace's profile popularity, weighted by the GPU's idle compute)
//     grows least.
//   - MIGFGD: FGD on MIG: the node, GPU and placement that reduce FGD's
//     fragmentation measure the most, with a GPU "able to host" a shape
//     when the shape's profile can be placed in its free slices; node
//     scores squashed to FGD's integers (ties to the tie-break order).
//   - MIGFGDFirstFit: MIGFGD's node score, with the GPU and placement in
//     the node taken first-fit (to tell the node choice from the
//     placement choice).
const (
	MIGFirstFit    = "firstfit"
	MIGFrag        = "frag"
	MIGFGD         = "fgd"
	MIGFGDFirstFit = "fgd-firstfit"
)

// DefaultMIGModel is the GPU geometry of the MIG replay. The trace has no
// GPU memory, so every model of package mig (all have the A100/H100
// geometry) gives the same numbers.
const DefaultMIGModel = "A100-SXM4-40GB"

// MIGPolicies lists the MIG replay's policies.
func MIGPolicies() []string { return []string{MIGFirstFit, MIGFrag, MIGFGDFirstFit, MIGFGD} }

// MIGConfig selects what RunMIG simulates.
type MIGConfig struct {
	Policy string
	Seed   int64
	Plan   PlanOptions
	// Model is the MIG geometry (DefaultMIGModel when empty).
	Model string
	// Popularity is the share of pods the FGD target workload covers
	// (allocator.DefaultPopularity when 0).
	Popularity float64
}

// MIGResult is one MIG replay.
type MIGResult struct {
	Policy    string
	Workload  string
	Seed      int64
	TotalGPUs int
	// Pods arrived, Placed of them; GPUPods and GPUPlaced count the pods
	// that ask for a GPU.
	Pods, Placed         int
	GPUPods, GPUPlaced   int
	ArrivedMilli, Demand int64 // GPU milli asked by arrived pods, and by placed ones
	// Curve is the pods' GPU demand placed (their gpu_milli, as the
	// non-MIG replay's allocation) against the arrived workload:
	// UnallocatedPct is 100 - placed demand %. FragPct is 0.
	Curve []Point
	// SliceCurve is the MIG compute handed out (each instance's compute
	// slices / 7 of a GPU) against the arrived workload.
	SliceCurve []Point
	// Profiles counts the placed pods per profile (whole-GPU pods count
	// once per GPU).
	Profiles map[string]int
}

// migRequest is a pod's demand in MIG terms.
type migRequest struct {
	profile int // index in the model's profiles; -1 for CPU-only
	count   int // instances (GPUs for whole-GPU pods)
}

// MIGProfileOf maps a pod's request to its MIG profile on model: the full
// GPU for whole-GPU pods (count = GPUs), the smallest covering profile for
// a slice (count 1). ok is false for CPU-only pods and for slices no
// profile covers.
func MIGProfileOf(model *mig.Model, r allocator.Request) (p mig.Profile, count int, ok bool) {
	switch r.Kind() {
	case allocator.Whole:
		return model.Full(), r.GPUs, true
	case allocator.Shared:
		p, ok := mig.Smallest(model, r.GPUMilli, r.GPUMemMiB)
		return p, 1, ok
	}
	return mig.Profile{}, 0, false
}

func profileIndex(m *mig.Model, name string) int {
	for i := range m.Profiles {
		if m.Profiles[i].Name == name {
			return i
		}
	}
	return -1
}

// migGPU is one GPU of the replay: free memory slices and compute used.
type migGPU struct {
	free    uint8
	compute int
}

// migNode is one node of the replay.
type migNode struct {
	model    string
	cpu, mem int64
	gpus     []migGPU
}

// migShape is a target-workload shape in MIG terms.
type migShape struct {
	cpu     int64
	profile int
	count   int
	models  []string
	freq    float64
}

func (s *migShape) allows(model string) bool {
	if len(s.models) == 0 {
		return true
	}
	for _, m := range s.models {
		if m == model {
			return true
		}
	}
	return false
}

// migReplay holds what one MIG replay needs.
type migReplay struct {
	model  *mig.Model
	meter  *mig.Meter // profile popularity of the trace
	shapes []migShape // FGD target workload
	policy string
}

const fullMask = uint8(1<<8 - 1)

// idleMilli is a GPU's unused compute in milli of a GPU.
func (g migGPU) idleMilli() float64 {
	return float64(mig.ComputeSlices-g.compute) * allocator.MilliPerGPU / mig.ComputeSlices
}

// hosts reports whether the GPU can take one unit of the shape.
func (r *migReplay) hosts(s *migShape, g migGPU) bool {
	if s.count > 1 || s.profile == len(r.model.Profiles)-1 {
		return g.free == fullMask
	}
	return r.model.Placeable(s.profile, g.free)
}

// nodeFrag is FGD's fragmentation measure of a node state (the amount of
// allocator.FragAmount.Fragmented) on MIG.
func (r *migReplay) nodeFrag(model string, cpu int64, gpus []migGPU) float64 {
	var idle float64
	for _, g := range gpus {
		idle += g.idleMilli()
	}
	var out float64
	for si := range r.shapes {
		s := &r.shapes[si]
		if s.profile < 0 || !s.allows(model) || cpu < s.cpu {
			out += s.freq * idle
			continue
		}
		hosts := 0
		var small float64
		for _, g := range gpus {
			if r.hosts(s, g) {
				hosts++
			} else {
				small += g.idleMilli()
			}
		}
		if hosts >= s.count {
			out += s.freq * small
		} else {
			out += s.freq * idle
		}
	}
	return out
}

// gpuFrag is MIGFrag's measure of one GPU: its idle compute times the
// share of the demand it can no longer place.
func (r *migReplay) gpuFrag(g migGPU) float64 {
	return g.idleMilli() * r.meter.Unplaceable(g.free)
}

// migChoice is where a pod goes on a node.
type migChoice struct {
	score float64
	gpus  []int // GPU positions
	start int   // slice pods: the instance's first memory slice
}

// fits reports whether the pod fits the node.
func (r *migReplay) fits(n *migNode, req allocator.Request, mr migRequest) bool {
	if mr.profile >= 0 && (len(n.gpus) == 0 || !req.AllowsModel(n.model)) {
		return false
	}
	if n.cpu < req.CPUMilli || n.mem < req.MemMiB {
		return false
	}
	switch {
	case mr.profile < 0:
		return true
	case mr.count > 1 || mr.profile == len(r.model.Profiles)-1:
		free := 0
		for _, g := range n.gpus {
			if g.free == fullMask {
				free++
			}
		}
		return free >= mr.count
	}
	for _, g := range n.gpus {
		if r.model.Placeable(mr.profile, g.free) {
			return true
		}
	}
	return false
}

// evaluate chooses the pod's GPUs and placement on a node it fits, and
// scores the node (MIGFGD only; the others take the first node).
func (r *migReplay) evaluate(n *migNode, req allocator.Request, mr migRequest) migChoice {
	c := migChoice{}
	switch {
	case mr.profile < 0:
	case mr.count > 1 || mr.profile == len(r.model.Profiles)-1:
		for i, g := range n.gpus {
			if len(c.gpus) < mr.count && g.free == fullMask {
				c.gpus = append(c.gpus, i)
			}
		}
	case r.policy == MIGFirstFit || r.policy == MIGFGDFirstFit:
		for i, g := range n.gpus {
			if st, ok := r.model.BestStart(mr.profile, g.free, mig.FirstFit, nil); ok {
				c.gpus, c.start = []int{i}, st
				break
			}
		}
	default:
		p := r.model.Profiles[mr.profile]
		bestDelta := math.Inf(1)
		bestU, bestRoom := 0.0, 0.0
		var buf [allocator.MaxGPUsPerNode]migGPU
		gpus := buf[:len(n.gpus)]
		copy(gpus, n.gpus)
		cpu := n.cpu - req.CPUMilli
		seen := make(map[migGPU]bool, len(n.gpus))
		for i, g := range n.gpus {
			if seen[g] || !r.model.Placeable(mr.profile, g.free) {
				continue
			}
			seen[g] = true // GPUs in the same state give the same result: the first one is taken
			before := r.gpuFrag(g)
			for _, st := range p.Starts {
				sp := uint8((1<<p.Size - 1) << st)
				if g.free&sp != sp {
					continue
				}
				after := migGPU{free: g.free &^ sp, compute: g.compute + p.Compute}
				var delta float64
				if r.policy == MIGFGD {
					gpus[i] = after
					delta = r.nodeFrag(n.model, cpu, gpus)
					gpus[i] = g
				} else {
					delta = r.gpuFrag(after) - before
				}
				u, room := r.meter.Unplaceable(after.free), r.meter.Room(after.free)
				if delta < bestDelta-1e-9 || (delta <= bestDelta+1e-9 && (u < bestU-1e-12 || (u <= bestU+1e-12 && room > bestRoom+1e-12))) {
					bestDelta, bestU, bestRoom = delta, u, room
					c.gpus, c.start = []int{i}, st
				}
			}
		}
	}
	if r.fgdNodes() {
		before := r.nodeFrag(n.model, n.cpu, n.gpus)
		var buf [allocator.MaxGPUsPerNode]migGPU
		gpus := buf[:len(n.gpus)]
		copy(gpus, n.gpus)
		r.apply(gpus, mr, c)
		after := r.nodeFrag(n.model, n.cpu-req.CPUMilli, gpus)
		c.score = float64(int64(100 / (1 + math.Exp(-(before-after)/1000))))
	}
	return c
}

// fgdNodes reports whether nodes are chosen by FGD's score (else the
// first that fits).
func (r *migReplay) fgdNodes() bool { return r.policy == MIGFGD || r.policy == MIGFGDFirstFit }

// apply marks the choice on gpus.
func (r *migReplay) apply(gpus []migGPU, mr migRequest, c migChoice) {
	if mr.profile < 0 {
		return
	}
	p := r.model.Profiles[mr.profile]
	if len(c.gpus) > 0 && (mr.count > 1 || mr.profile == len(r.model.Profiles)-1) {
		for _, i := range c.gpus {
			gpus[i] = migGPU{free: 0, compute: mig.ComputeSlices}
		}
		return
	}
	for _, i := range c.gpus {
		gpus[i].free &^= uint8((1<<p.Size - 1) << c.start)
		gpus[i].compute += p.Compute
	}
}

// newMIGReplay builds the model, the trace's profile popularity and the
// FGD target workload in MIG terms.
func newMIGReplay(t *Trace, cfg MIGConfig) (*migReplay, error) {
	name := cfg.Model
	if name == "" {
		name = DefaultMIGModel
	}
	model, ok := mig.Lookup(name)
	if !ok {
		return nil, fmt.Errorf("unknown MIG model %q (known: %s)", name, strings.Join(mig.Models(), ", "))
	}
	policy := strings.ToLower(strings.TrimSpace(cfg.Policy))
	switch policy {
	case MIGFirstFit, MIGFrag, MIGFGD, MIGFGDFirstFit:
	default:
		return nil, fmt.Errorf("unknown MIG policy %q (known: %s)", cfg.Policy, strings.Join(MIGPolicies(), ", "))
	}
	r := &migReplay{model: model, policy: policy}

	// Profile popularity: one count per pod (a k-GPU pod counts k full GPUs).
	demand := make(map[string]float64)
	type key struct {
		cpu            int64
		profile, count int
		models         string
	}
	counts := make(map[key]float64)
	first := make(map[key]migShape)
	for _, p := range t.Pods {
		prof, n, ok := MIGProfileOf(model, p.Request)
		k := key{cpu: p.Request.CPUMilli, profile: -1}
		if ok {
			demand[prof.Name] += float64(n)
			k.profile, k.count, k.models = profileIndex(model, prof.Name), n, strings.Join(p.Request.Models, "|")
		} else if p.Request.Kind() != allocator.CPUOnly {
			return nil, fmt.Errorf("pod %s: no %s profile covers %s", p.Name, model.Name, p.Request)
		}
		if _, seen := first[k]; !seen {
			s := migShape{cpu: k.cpu, profile: k.profile, count: k.count}
			if ok {
				s.models = p.Request.Models
			}
			first[k] = s
		}
		counts[k]++
	}
	meter, err := mig.NewMeter(model, demand)
	if err != nil {
		return nil, fmt.Errorf("%s: profile popularity: %w", t.Workload, err)
	}
	r.meter = meter

	// The target workload: the most popular shapes covering the
	// popularity share of pods, renormalised (as allocator.NewWorkload).
	pop := cfg.Popularity
	if pop == 0 {
		pop = allocator.DefaultPopularity
	}
	keys := make([]key, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		a, b := keys[i], keys[j]
		switch {
		case counts[a] != counts[b]:
			return counts[a] > counts[b]
		case a.cpu != b.cpu:
			return a.cpu < b.cpu
		case a.profile != b.profile:
			return a.profile < b.profile
		case a.count != b.count:
			return a.count < b.count
		}
		return a.models < b.models
	})
	total := float64(len(t.Pods))
	var covered float64
	for _, k := range keys {
		if covered/total >= pop {
			break
		}
		s := first[k]
		s.freq = counts[k]
		covered += counts[k]
		r.shapes = append(r.shapes, s)
	}
	for i := range r.shapes {
		r.shapes[i].freq /= covered
	}
	return r, nil
}

// RunMIG replays one seed of a trace on MIG GPUs under one MIG policy.
func RunMIG(t *Trace, cfg MIGConfig) (*MIGResult, error) {
	r, err := newMIGReplay(t, cfg)
	if err != nil {
		return nil, err
	}
	plan, err := NewPlan(t, cfg.Seed, cfg.Plan)
	if err != nil {
		return nil, fmt.Errorf("%s seed %d: %w", t.Workload, cfg.Seed, err)
	}
	nodes := make([]*migNode, len(plan.Nodes))
	for i, s := range plan.Nodes {
		n := &migNode{model: s.Model, cpu: s.CPUMilli, mem: s.MemMiB, gpus: make([]migGPU, s.GPUs)}
		for g := range n.gpus {
			n.gpus[g].free = fullMask
		}
		nodes[i] = n
	}
	// Nodes in tie-break order: the first-fit policies scan them so.
	byRank := make([]int, len(nodes))
	for i := range byRank {
		byRank[i] = i
	}
	sort.Slice(byRank, func(a, b int) bool { return plan.Rank[byRank[a]] < plan.Rank[byRank[b]] })

	res := &MIGResult{
		Policy:    r.policy,
		Workload:  t.Workload,
		Seed:      cfg.Seed,
		TotalGPUs: t.TotalGPUs(),
		Pods:      len(plan.Order),
		Profiles:  make(map[string]int),
	}
	reqs := make([]migRequest, len(plan.Pods))
	for i, p := range plan.Pods {
		prof, n, ok := MIGProfileOf(r.model, p.Request)
		reqs[i] = migRequest{profile: -1}
		if ok {
			reqs[i] = migRequest{profile: profileIndex(r.model, prof.Name), count: n}
		}
	}
	// Evaluations are cached per request shape and node until the node
	// changes (as in replay).
	type cache struct {
		ver  []uint32
		fits []bool
		ch   []migChoice
	}
	caches := make(map[string]*cache)
	version := make([]uint32, len(nodes))
	for i := range version {
		version[i] = 1
	}
	events := make([]Event, 0, len(plan.Order))
	sliceEvents := make([]Event, 0, len(plan.Order))
	var slices int64 // compute slices handed out
	for _, pi := range plan.Order {
		req := plan.Pods[pi].Request
		mr := reqs[pi]
		res.ArrivedMilli += req.TotalGPUMilli()
		if mr.profile >= 0 {
			res.GPUPods++
		}
		k := shapeID(req)
		c := caches[k]
		if c == nil {
			c = &cache{ver: make([]uint32, len(nodes)), fits: make([]bool, len(nodes)), ch: make([]migChoice, len(nodes))}
			caches[k] = c
		}
		look := func(i int) (bool, migChoice) {
			if c.ver[i] != version[i] {
				c.ver[i] = version[i]
				c.fits[i] = r.fits(nodes[i], req, mr)
				if c.fits[i] {
					c.ch[i] = r.evaluate(nodes[i], req, mr)
				}
			}
			return c.fits[i], c.ch[i]
		}
		best := -1
		var bestCh migChoice
		if r.fgdNodes() {
			for i := range nodes {
				ok, ch := look(i)
				if ok && (best < 0 || ch.score > bestCh.score || (ch.score == bestCh.score && plan.Rank[i] < plan.Rank[best])) {
					best, bestCh = i, ch
				}
			}
		} else {
			for _, i := range byRank {
				if ok, ch := look(i); ok {
					best, bestCh = i, ch
					break
				}
			}
		}
		if best >= 0 {
			n := nodes[best]
			n.cpu -= req.CPUMilli
			n.mem -= req.MemMiB
			r.apply(n.gpus, mr, bestCh)
			version[best]++
			res.Placed++
			if mr.profile >= 0 {
				res.GPUPlaced++
				res.Demand += req.TotalGPUMilli()
				p := r.model.Profiles[mr.profile]
				slices += int64(p.Compute * mr.count)
				res.Profiles[p.Name] += mr.count
			}
		}
		events = append(events, Event{ArrivedMilli: res.ArrivedMilli, UsedMilli: res.Demand})
		sliceEvents = append(sliceEvents, Event{ArrivedMilli: res.ArrivedMilli, UsedMilli: slices * allocator.MilliPerGPU / mig.ComputeSlices})
	}
	res.Curve = BinEvents(events, res.TotalGPUs)
	res.SliceCurve = BinEvents(sliceEvents, res.TotalGPUs)
	return res, nil
}

// MIGJob is one MIG replay to run.
type MIGJob struct {
	Trace  *Trace
	Config MIGConfig
}

// MIGJobs builds the grid traces x policies x seeds.
func MIGJobs(traces []*Trace, policies []string, seeds []int64, base MIGConfig) []MIGJob {
	var out []MIGJob
	for _, t := range traces {
		for _, p := range policies {
			for _, s := range seeds {
				c := base
				c.Policy, c.Seed = p, s
				out = append(out, MIGJob{Trace: t, Config: c})
			}
		}
	}
	return out
}

// RunMIGAll runs jobs on `workers` goroutines; results in job order. It
// stops at the first error or when ctx is cancelled. progress, when not
// nil, is called after each job (serialised).
func RunMIGAll(ctx context.Context, jobs []MIGJob, workers int, progress func(done, total int, r *MIGResult)) ([]*MIGResult, error) {
	return runParallel(ctx, jobs, workers, func(j MIGJob) (*MIGResult, error) { return RunMIG(j.Trace, j.Config) }, progress)
}

// MIGSummary aggregates the MIG runs of one workload and policy.
type MIGSummary struct {
	Workload, Policy string
	Seeds            []int64
	// Unplaced is 100 - placed GPU demand % at 100% arrived (the non-MIG
	// replay's "unallocated GPU %"); Idle is 100 - MIG compute handed out %
	// at 100% arrived; PodsPlaced and GPUPodsPlaced are the % of arrived
	// pods, and of arrived GPU pods, placed by the end of the run (130%
	// arrived).
	Unplaced, Idle, PodsPlaced, GPUPodsPlaced Stats
	// Curve is the mean placed-demand curve (for WriteSVG).
	Curve []Point
	// Profiles is the mean number of instances per profile at the end.
	Profiles map[string]float64
}

// SummarizeMIG groups MIG results by workload and policy, in first-seen order.
func SummarizeMIG(results []*MIGResult) []MIGSummary {
	groups := groupByRun(results, func(r *MIGResult) runKey { return runKey{r.Workload, r.Policy} })
	out := make([]MIGSummary, 0, len(groups))
	for _, g := range groups {
		rs := g.results
		s := MIGSummary{Workload: g.key.workload, Policy: g.key.policy, Profiles: make(map[string]float64)}
		var unpl, idle, pods, gpuPods []float64
		byPct := make(map[int][]float64)
		for _, r := range rs {
			s.Seeds = append(s.Seeds, r.Seed)
			if p, ok := At(r.Curve, 100); ok {
				unpl = append(unpl, p.UnallocatedPct)
			}
			if p, ok := At(r.SliceCurve, 100); ok {
				idle = append(idle, p.UnallocatedPct)
			}
			if r.GPUPods > 0 {
				gpuPods = append(gpuPods, 100*float64(r.GPUPlaced)/float64(r.GPUPods))
			}
			if r.Pods > 0 {
				pods = append(pods, 100*float64(r.Placed)/float64(r.Pods))
			}
			for _, p := range r.Curve {
				byPct[p.ArrivedPct] = append(byPct[p.ArrivedPct], p.UnallocatedPct)
			}
			for name, n := range r.Profiles {
				s.Profiles[name] += float64(n) / float64(len(rs))
			}
		}
		s.Unplaced, s.Idle, s.PodsPlaced, s.GPUPodsPlaced = MeanSD(unpl), MeanSD(idle), MeanSD(pods), MeanSD(gpuPods)
		pcts := make([]int, 0, len(byPct))
		for pct := range byPct {
			pcts = append(pcts, pct)
		}
		sort.Ints(pcts)
		for _, pct := range pcts {
			m := MeanSD(byPct[pct]).Mean
			s.Curve = append(s.Curve, Point{ArrivedPct: pct, UnallocatedPct: m, AllocPct: 100 - m})
		}
		out = append(out, s)
	}
	return out
}

// Summary turns a MIG summary into a Summary (policy "mig-<policy>")
// for WriteSVG, next to non-MIG ones.
func (s MIGSummary) Summary() Summary {
	return Summary{Workload: s.Workload, Policy: "mig-" + s.Policy, Seeds: s.Seeds, Curve: s.Curve, Unallocated: s.Unplaced}
}
