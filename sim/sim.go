package sim

import (
	"fmt"
	"strings"

	"github.com/tessera-gpu/tessera/allocator"
)

// Event is the cluster after one pod arrived (and was placed or dropped).
type Event struct {
	// ArrivedMilli is the GPU compute requested by all pods arrived so far,
	// placed or not.
	ArrivedMilli int64
	// UsedMilli is the GPU compute allocated in the cluster.
	UsedMilli int64
	// FragMilli is the cluster's fragmented GPU compute (FGD's measure,
	// with respect to the target workload).
	FragMilli float64
}

// Config selects what Run simulates.
type Config struct {
	Policy string
	Seed   int64
	Plan   PlanOptions
	// Popularity is the share of pods the FGD target workload covers
	// (allocator.DefaultPopularity, the artifact's 95%, when 0). The tessera
	// policy is always given every pod shape (popularity 1).
	Popularity float64
	// Tessera, when set, overrides the tessera policy's tuning.
	Tessera *allocator.TesseraConfig
}

// Result is one simulation run.
type Result struct {
	Policy    string
	Workload  string
	Seed      int64
	TotalGPUs int
	// Pods is the number of pods that arrived; Placed of them were placed.
	Pods   int
	Placed int
	Events []Event
	// Curve is Events binned by arrived workload (see BinEvents).
	Curve []Point
	// Evaluations counts policy evaluations (cache misses), for profiling.
	Evaluations int64
}

// TargetWorkload builds the FGD target workload of a trace: the most
// popular pod shapes of the original pod list (before sampling).
func TargetWorkload(t *Trace, popularity float64) (allocator.Workload, error) {
	if popularity == 0 {
		popularity = allocator.DefaultPopularity
	}
	reqs := make([]allocator.Request, len(t.Pods))
	for i, p := range t.Pods {
		reqs[i] = p.Request
	}
	w, err := allocator.NewWorkload(reqs, popularity)
	if err != nil {
		return allocator.Workload{}, fmt.Errorf("target workload of %s: %w", t.Workload, err)
	}
	return w, nil
}

// ModelCapacity counts the GPUs of each model.
func ModelCapacity(nodes []NodeSpec) map[string]int {
	out := make(map[string]int)
	for _, n := range nodes {
		if n.GPUs > 0 {
			out[n.Model] += n.GPUs
		}
	}
	return out
}

// NewNodes builds empty node snapshots from node specs.
func NewNodes(specs []NodeSpec) []*allocator.Node {
	nodes := make([]*allocator.Node, len(specs))
	for i, s := range specs {
		n := &allocator.Node{
			Name:             s.Name,
			Model:            s.Model,
			CPUMilliCapacity: s.CPUMilli,
			CPUMilliFree:     s.CPUMilli,
			MemMiBCapacity:   s.MemMiB,
			MemMiBFree:       s.MemMiB,
			GPUs:             make([]allocator.GPU, s.GPUs),
		}
		for g := range n.GPUs {
			n.GPUs[g] = allocator.GPU{Index: g, MilliFree: allocator.MilliPerGPU}
		}
		nodes[i] = n
	}
	return nodes
}

// shapeCache remembers, for one request shape, each node's fit and
// evaluation as of a node version.
type shapeCache struct {
	ver  []uint32
	fits []bool
	ev   []allocator.Evaluation
}

// Run replays one seed of a trace under one policy.
func Run(t *Trace, cfg Config) (*Result, error) {
	plan, err := NewPlan(t, cfg.Seed, cfg.Plan)
	if err != nil {
		return nil, fmt.Errorf("%s seed %d: %w", t.Workload, cfg.Seed, err)
	}
	workload, err := TargetWorkload(t, cfg.Popularity)
	if err != nil {
		return nil, err
	}
	policyWorkload := workload
	if strings.EqualFold(strings.TrimSpace(cfg.Policy), allocator.PolicyTessera) {
		if policyWorkload, err = TargetWorkload(t, 1); err != nil {
			return nil, err
		}
	}
	opts := []allocator.Option{
		allocator.WithWorkload(policyWorkload),
		allocator.WithRand(plan.Rand),
		allocator.WithModelCapacity(ModelCapacity(t.Nodes)),
	}
	if cfg.Tessera != nil {
		opts = append(opts, allocator.WithTesseraConfig(*cfg.Tessera))
	}
	policy, err := allocator.NewPolicy(cfg.Policy, opts...)
	if err != nil {
		return nil, err
	}
	meter, err := allocator.NewFragMeter(workload)
	if err != nil {
		return nil, err
	}
	return replay(plan, policy, meter, t, cfg)
}

func replay(plan *Plan, policy allocator.Policy, meter *allocator.FragMeter, t *Trace, cfg Config) (*Result, error) {
	nodes := NewNodes(plan.Nodes)
	res := &Result{
		Policy:    policy.Name(),
		Workload:  t.Workload,
		Seed:      cfg.Seed,
		TotalGPUs: t.TotalGPUs(),
		Pods:      len(plan.Order),
		Events:    make([]Event, 0, len(plan.Order)),
	}

	// Group pods by identical request so evaluations can be reused while a
	// node is unchanged.
	shapeOf := make([]int, len(plan.Pods))
	ids := make(map[string]int)
	for i, p := range plan.Pods {
		k := shapeID(p.Request)
		id, ok := ids[k]
		if !ok {
			id = len(ids)
			ids[k] = id
		}
		shapeOf[i] = id
	}
	caches := make([]*shapeCache, len(ids))
	cacheable := !allocator.IsRandomized(policy)

	version := make([]uint32, len(nodes))
	for i := range version {
		version[i] = 1
	}
	frag := make([]float64, len(nodes))
	for i, n := range nodes {
		frag[i] = meter.Amount(n).Fragmented()
	}

	var arrived, used int64
	for _, pi := range plan.Order {
		req := plan.Pods[pi].Request
		arrived += req.TotalGPUMilli()

		var c *shapeCache
		if cacheable {
			c = caches[shapeOf[pi]]
			if c == nil {
				c = &shapeCache{
					ver:  make([]uint32, len(nodes)),
					fits: make([]bool, len(nodes)),
					ev:   make([]allocator.Evaluation, len(nodes)),
				}
				caches[shapeOf[pi]] = c
			}
		}
		best := -1
		var bestEv allocator.Evaluation
		for i, n := range nodes {
			var fits bool
			var ev allocator.Evaluation
			if c != nil && c.ver[i] == version[i] {
				fits, ev = c.fits[i], c.ev[i]
			} else {
				fits = allocator.Fit(n, req) == allocator.Fits
				if fits {
					ev = policy.Evaluate(n, req)
					res.Evaluations++
				}
				if c != nil {
					c.ver[i], c.fits[i], c.ev[i] = version[i], fits, ev
				}
			}
			if !fits {
				continue
			}
			if best < 0 || allocator.Preferred(ev, plan.Rank[i], bestEv, plan.Rank[best]) {
				best, bestEv = i, ev
			}
		}
		if best >= 0 {
			if err := allocator.Apply(nodes[best], req, bestEv.GPUs); err != nil {
				return nil, fmt.Errorf("%s seed %d policy %s: pod %s: %w", t.Workload, cfg.Seed, policy.Name(), plan.Pods[pi].Name, err)
			}
			version[best]++
			used += req.TotalGPUMilli()
			frag[best] = meter.Amount(nodes[best]).Fragmented()
			res.Placed++
		}
		var clusterFrag float64
		for _, f := range frag {
			clusterFrag += f
		}
		res.Events = append(res.Events, Event{ArrivedMilli: arrived, UsedMilli: used, FragMilli: clusterFrag})
	}
	res.Curve = BinEvents(res.Events, res.TotalGPUs)
	return res, nil
}

// shapeID is a key equal for requests that are equal.
func shapeID(r allocator.Request) string {
	return fmt.Sprintf("%d/%d/%d/%d/%d/%s", r.CPUMilli, r.MemMiB, r.GPUs, r.GPUMilli, r.GPUMemMiB, strings.Join(r.Models, "|"))
}
