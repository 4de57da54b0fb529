package bound

import (
	"fmt"
	"math"

	"github.com/tessera-gpu/tessera/allocator"
	"github.com/tessera-gpu/tessera/sim"
)

// Unallocated is a lower bound on the unallocated GPU % a replay reports at one
// arrived percentage, for any policy: online or offline, with hindsight or
// not, no placement of the pods arrived by then holds more than the
// packing bound (Pack) nor more than they ask.
type Unallocated struct {
	Workload   string
	Seed       int64
	ArrivedPct int
	// UnallocatedPct is the bound on the replay's UnallocatedPct at
	// ArrivedPct (before its rounding to 2 decimals).
	UnallocatedPct float64
	// Events are the arrivals averaged at ArrivedPct, as sim.BinEvents takes
	// them.
	Events int
	// Packable is the packing bound of the pods arrived by the last of
	// them.
	Packable Packable
}

// UnallocatedAt bounds, for one seed of t, the unallocated GPU % at pct
// (FGD's protocol: the arrivals of sim.NewPlan, each point the mean over
// the arrivals whose arrived percentage rounds to it, as sim.BinEvents
// does).
// Every arrival k there has allocated at most min(its arrived milli, the
// packing bound of the pods arrived by the last one): the bound of a
// prefix is never above that of a longer one.
func UnallocatedAt(t *sim.Trace, seed int64, o sim.PlanOptions, pct int) (*Unallocated, error) {
	plan, err := sim.NewPlan(t, seed, o)
	if err != nil {
		return nil, fmt.Errorf("%s seed %d: %w", t.Workload, seed, err)
	}
	tot := float64(t.TotalGPUs())
	if tot == 0 {
		return nil, fmt.Errorf("%s: the cluster has no GPUs", t.Workload)
	}
	at := func(lo, hi int) (first, last int) {
		first, last = -1, -1
		var arrived int64
		for k, pi := range plan.Order {
			arrived += plan.Pods[pi].Request.TotalGPUMilli()
			ar := int(math.RoundToEven(float64(arrived) / tot / 10))
			if ar >= lo && ar <= hi {
				if first < 0 {
					first = k
				}
				last = k
			}
		}
		return first, last
	}
	first, last := at(pct, pct)
	if first < 0 {
		first, last = at(pct-1, pct+1) // sim.BinEvents' fallback
	}
	if first < 0 {
		return nil, fmt.Errorf("%s seed %d: no arrival near %d %%", t.Workload, seed, pct)
	}
	pods := make([]allocator.Request, 0, last+1)
	var arrived []int64
	var sum int64
	for k, pi := range plan.Order[:last+1] {
		r := plan.Pods[pi].Request
		pods = append(pods, r)
		sum += r.TotalGPUMilli()
		if k >= first {
			arrived = append(arrived, sum)
		}
	}
	pb, err := Pack(t.TotalGPUs(), pods)
	if err != nil {
		return nil, fmt.Errorf("%s seed %d: %w", t.Workload, seed, err)
	}
	var unalloc float64
	for _, a := range arrived {
		used := math.Min(float64(a), pb.Milli)
		unalloc += 100 - used/tot/10
	}
	return &Unallocated{
		Workload:       t.Workload,
		Seed:           seed,
		ArrivedPct:     pct,
		UnallocatedPct: unalloc / float64(len(arrived)),
		Events:         len(arrived),
		Packable:       pb,
	}, nil
}
