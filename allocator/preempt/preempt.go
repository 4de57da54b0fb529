// Package preempt chooses the victims of a priority preemption: on which
// node, and which workloads, so that the freed GPUs fit the asker there.
// It is pure: the caller says what may be evicted (units already filtered
// for priority, budgets, minimum runtime and quota) and answers, through a
// callback, whether the asker fits a node once some units are gone — the
// same fit the scheduler extender applies, whatever the shapes (whole GPUs
// or slices) of asker and victims.
package preempt

import (
	"sort"
	"time"
)

// Unit is what one eviction decision takes: a whole gang, or one pod.
type Unit struct {
	// Key names the unit (namespace/name of the gang or the pod).
	Key      string
	Priority int32
	// Started is when the unit started; among equal priorities the newest
	// goes first (it has lost the least work).
	Started time.Time
	// Pods is how many pods evicting the unit ends, on every node.
	Pods int
	// Extra marks a member of an elastic gang beyond its minimum: among
	// equal priorities, extras go before any whole workload.
	Extra bool
	// Elsewhere marks a unit of a candidate with no pod on the
	// candidate's node: it frees no room there, and is offered for what
	// else the asker needs gone (its namespace's ElasticQuota, when the
	// asker is above its max: its own lower-priority work anywhere). Among
	// equal priorities the node's own units go first, and of two choices
	// of one cost the one with fewer units elsewhere wins: the room
	// evicted is then the room the asker takes, and no other node is left
	// with a hole.
	Elsewhere bool
}

// Candidate is a node and the units with a pod on it that may be evicted.
type Candidate struct {
	Node  string
	Units []Unit
}

// Choice is a decided preemption.
type Choice struct {
	Node    string
	Victims []Unit
}

// Fits reports whether the asker fits node once victims are gone.
type Fits func(node string, victims []Unit) bool

// Choose returns the cheapest preemption among the candidates, or false
// when none makes the asker fit. On each node the units are taken lowest
// priority first, then the extra members of elastic gangs, then newest
// first, until the asker fits; then every
// taken unit is given back again, highest priority first, while the asker
// still fits without it, so that no eviction is made that the fit does not
// need; a single unit that suffices alone replaces that set when it costs
// less. Among nodes, the choice whose most important victim has the lowest
// priority wins, then the one that ends the fewest pods, then the one
// that takes the fewest whole workloads (the extra members of elastic
// gangs go first), then the one with the fewest units elsewhere, then the
// fewest units, then the node name. Choose assumes the asker fits no node
// with no victim: the caller checks that first (a node where it fits would
// still get one victim), or its fit needs some victim whatever the room
// (a pod above its namespace's ElasticQuota max).
func Choose(cands []Candidate, fits Fits) (Choice, bool) {
	var best Choice
	var bestCost cost
	found := false
	for _, c := range cands {
		victims, ok := onNode(c, fits)
		if !ok || len(victims) == 0 {
			continue
		}
		k := costOf(victims)
		if !found || k.less(bestCost) || (k == bestCost && c.Node < best.Node) {
			best, bestCost, found = Choice{Node: c.Node, Victims: victims}, k, true
		}
	}
	return best, found
}

// onNode chooses the victims on one node: the greedy prefix, then the
// reprieves, or a single unit that suffices and costs less.
func onNode(c Candidate, fits Fits) ([]Unit, bool) {
	units := append([]Unit(nil), c.Units...)
	sort.SliceStable(units, func(i, j int) bool {
		a, b := units[i], units[j]
		switch {
		case a.Priority != b.Priority:
			return a.Priority < b.Priority
		case a.Extra != b.Extra:
			return a.Extra
		case a.Elsewhere != b.Elsewhere:
			return !a.Elsewhere
		case !a.Started.Equal(b.Started):
			return a.Started.After(b.Started)
		}
		return a.Key < b.Key
	})
	if len(units) == 0 || !fits(c.Node, units) {
		return nil, false // even every unit gone leaves no room
	}
	n := 1
	for ; n < len(units); n++ {
		if fits(c.Node, units[:n]) {
			break
		}
	}
	taken := reprieve(c.Node, append([]Unit(nil), units[:n]...), fits)
	// The greedy order can take several units where one other would do
	// (two slices of one GPU before the lone slice of another): the best
	// single unit that suffices wins when it costs less.
	for _, u := range units {
		one := []Unit{u}
		if costOf(one).less(costOf(taken)) && fits(c.Node, one) {
			taken = one
		}
	}
	return taken, true
}

// reprieve gives taken units back, most important first (the last taken),
// while the asker still fits without them.
func reprieve(node string, taken []Unit, fits Fits) []Unit {
	// Reprieve, most important first: the last units taken are the most
	// important, so walk the prefix backwards.
	for i := len(taken) - 1; i >= 0 && len(taken) > 1; i-- {
		rest := make([]Unit, 0, len(taken)-1)
		rest = append(rest, taken[:i]...)
		rest = append(rest, taken[i+1:]...)
		if fits(node, rest) {
			taken = rest
		}
	}
	return taken
}

type cost struct {
	top                           int32
	whole, pods, elsewhere, units int
}

func (a cost) less(b cost) bool {
	switch {
	case a.top != b.top:
		return a.top < b.top
	case a.pods != b.pods:
		return a.pods < b.pods
	case a.whole != b.whole:
		return a.whole < b.whole
	case a.elsewhere != b.elsewhere:
		return a.elsewhere < b.elsewhere
	}
	return a.units < b.units
}

func costOf(victims []Unit) cost {
	k := cost{units: len(victims)}
	for i, v := range victims {
		if i == 0 || v.Priority > k.top {
			k.top = v.Priority
		}
		k.pods += v.Pods
		if !v.Extra {
			k.whole++
		}
		if v.Elsewhere {
			k.elsewhere++
		}
	}
	return k
}
