// Package consolidate decides which running pods to move so that a waiting
// workload of whole GPUs (a gang, or a queued pod) that fits nowhere gets
// whole nodes or NVLink cliques: fragmentation, not a lack of GPUs, keeps
// it waiting.
//
// Only pods that consent to it are moved: a pod marked preemptible, owned
// by a controller that recreates it elsewhere, and outside any gang (the
// caller says which, Pod.Movable). A move is an eviction; its pod comes
// back as a new pod, on the room that is left. So a plan is made only when
//
//   - the workload fits once the moved pods are gone (the caller's own
//     placement may be the judge, Fits), and every moved pod is needed for
//     that: a pod without which it still fits is not moved, so no eviction
//     frees GPUs the workload cannot use;
//   - the moved pods fit again elsewhere, on GPUs the workload does not
//     take (each on one node it may run on, Pod.MayRunOn);
//   - it needs no more moves than the budget allows (Budget: at most so
//     many per minute). A plan that needs more is not started: half a
//     consolidation frees room the workload cannot use.
//
// The simulator (sim/jobs, strategy reserve with consolidation) and the
// scheduler extender (extender/consolidate.go) call Decide.
package consolidate

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"time"
)

// Pod is a pod running on a node.
type Pod struct {
	Name string
	// GPUs are the positions of the node's GPUs it uses (whole GPUs, or
	// the GPU of a slice).
	GPUs []int
	// Movable: the pod may be moved (evicted, and recreated by its
	// controller elsewhere).
	Movable bool
	// MayRunOn reports whether the pod, recreated, may run on the named
	// node (its node selector and affinity, say); nil: on any node.
	MayRunOn func(node string) bool
	// CPUMilli and MemMiB are its CPU and memory requests: a moved pod
	// needs them free where it comes back.
	CPUMilli, MemMiB int64
	// NVLink: where it comes back, its GPUs must be in one NVLink clique.
	NVLink bool
}

// Node is a node as the decision sees it.
type Node struct {
	Name string
	// GPUs is how many GPUs the node has (positions 0 to GPUs-1).
	GPUs int
	// Cliques are the NVLink cliques as positions; none: the whole node is
	// one clique.
	Cliques [][]int
	Pods    []Pod
	// Unknown counts GPUs in use at positions not known yet (a pod bound
	// whose GPUs the node has not reported): never freed, and taken from
	// every clique's free count.
	Unknown int
	// Eligible: the workload may run here (its node selectors, GPU model).
	// Other nodes may still take moved pods.
	Eligible bool
	// Domain is the node's domain at the level where the workload must
	// fit in one (Workload.OneDomain): a rack, say.
	Domain string
	// CPUMilli and MemMiB are the CPU and memory its pods leave free
	// (allocatable minus their requests): moved pods come back only where
	// theirs fit, counting what the pods moved off a node give back and
	// what the workload's members placed there take.
	CPUMilli, MemMiB int64
}

// Workload is what waits.
type Workload struct {
	// Members are the whole GPUs of each member (one node each).
	Members []int
	// NVLink: each member's GPUs must be in one NVLink clique.
	NVLink bool
	// OneDomain: every member on nodes of one Node.Domain.
	OneDomain bool
	// CPUMilli and MemMiB are each member's CPU and memory requests, in
	// Members order (nil: none).
	CPUMilli, MemMiB []int64
}

// Move is one pod to move.
type Move struct {
	Node string
	Pod  string
	// GPUs is how many GPUs it frees (uses).
	GPUs int
}

// Plan is a consolidation: the pods to move and where the workload then
// fits by the model (the node of each member, in Workload.Members order).
type Plan struct {
	Moves     []Move
	Placement []string
}

// Fits judges whether the workload fits once the pods of moved are gone
// (the caller's own placement rule); nil: the model of this package.
type Fits func(moved []Move) bool

// Errors of Decide (test with errors.Is; the error says why).
var (
	// ErrFits: the workload fits without moving anything.
	ErrFits = errors.New("consolidate: it fits without moves")
	// ErrNoPlan: no moves of movable pods make it fit, or the pods moved
	// would find no room elsewhere.
	ErrNoPlan = errors.New("consolidate: no moves make it fit")
	// ErrBudget: it would fit after more moves than the budget allows.
	ErrBudget = errors.New("consolidate: more moves than the budget")
)

// Budget is how many moves may be made at now when at most perMinute are
// made in any minute and moves were made at the times of recent.
func Budget(now time.Time, recent []time.Time, perMinute int) int {
	n := perMinute
	for _, t := range recent {
		if now.Sub(t) < time.Minute {
			n--
		}
	}
	return max(n, 0)
}

// Validate reports a workload or nodes that cannot be decided on.
func Validate(nodes []Node, w Workload) error {
	if len(w.Members) == 0 {
		return fmt.Errorf("consolidate: a workload of no members")
	}
	for i, g := range w.Members {
		if g < 1 {
			return fmt.Errorf("consolidate: member %d asks for %d GPUs: want 1 or more", i, g)
		}
	}
	for _, r := range [][]int64{w.CPUMilli, w.MemMiB} {
		if r != nil && len(r) != len(w.Members) {
			return fmt.Errorf("consolidate: %d members, %d CPU or memory requests", len(w.Members), len(r))
		}
		for i, v := range r {
			if v < 0 {
				return fmt.Errorf("consolidate: member %d asks for %d CPU or memory: want 0 or more", i, v)
			}
		}
	}
	seen := map[string]bool{}
	for _, n := range nodes {
		if seen[n.Name] {
			return fmt.Errorf("consolidate: node %q given twice", n.Name)
		}
		seen[n.Name] = true
		if n.GPUs < 0 || n.Unknown < 0 || n.CPUMilli < 0 || n.MemMiB < 0 {
			return fmt.Errorf("consolidate: node %s: %d GPUs, %d unknown, %dm CPU and %d MiB free: want 0 or more", n.Name, n.GPUs, n.Unknown, n.CPUMilli, n.MemMiB)
		}
		in := func(pos int) bool { return pos >= 0 && pos < n.GPUs }
		for _, c := range n.Cliques {
			for _, pos := range c {
				if !in(pos) {
					return fmt.Errorf("consolidate: node %s: clique position %d of %d GPUs", n.Name, pos, n.GPUs)
				}
			}
		}
		for _, p := range n.Pods {
			if p.CPUMilli < 0 || p.MemMiB < 0 {
				return fmt.Errorf("consolidate: node %s: pod %s asks for %dm CPU and %d MiB: want 0 or more", n.Name, p.Name, p.CPUMilli, p.MemMiB)
			}
			for _, pos := range p.GPUs {
				if !in(pos) {
					return fmt.Errorf("consolidate: node %s: pod %s on position %d of %d GPUs", n.Name, p.Name, pos, n.GPUs)
				}
			}
		}
	}
	return nil
}

// Decide chooses the fewest moves (within budget) after which w fits on
// nodes (judged by fits, or by the model when fits is nil). It returns
// ErrFits when w fits already, ErrNoPlan when no moves of movable pods
// make it fit or the moved pods would find no room elsewhere, and ErrBudget
// when the fewest moves found exceed budget; each wrapped with the reason.
func Decide(nodes []Node, w Workload, budget int, fits Fits) (Plan, error) {
	if err := Validate(nodes, w); err != nil {
		return Plan{}, err
	}
	st := newState(nodes)
	if fits == nil {
		fits = func(moved []Move) bool { return st.without(moved).pack(w) != nil }
	}
	if fits(nil) {
		return Plan{}, ErrFits
	}
	// Each group of nodes the workload may use as a whole (every
	// eligible node, or each domain), the cheapest plan.
	var best *Plan
	var why error = fmt.Errorf("%w: no eligible node", ErrNoPlan)
	groups := st.groups(w)
	// tryWithout queues group again without each node moves free room on:
	// the plan failed for a reason the model does not see there. Bounded:
	// only the first len(st.nodes) groups add tries, so tries stay in
	// proportion.
	tryWithout := func(g int, moves []Move) {
		if g >= len(st.nodes) {
			return
		}
		for _, n := range st.targets(moves, groups[g]) {
			groups = append(groups, slices.DeleteFunc(slices.Clone(groups[g]), func(x int) bool { return x == n }))
		}
	}
	for g := 0; g < len(groups); g++ {
		group := groups[g]
		moves, ok := st.greedy(w, group)
		if !ok {
			why = fmt.Errorf("%w: the movable pods do not free room for every member", ErrNoPlan)
			continue
		}
		moves = prune(moves, fits)
		if !fits(moves) {
			why = fmt.Errorf("%w: the placement does not fit it on the room %d moves free", ErrNoPlan, len(moves))
			// The judge knows what the model does not (a required
			// label, say): try again without each node the model chose.
			tryWithout(g, moves)
			continue
		}
		after := st.without(moves)
		place := after.pack(w)
		if place == nil {
			// The caller's judge fits it, the model does not: the model
			// cannot say where it goes, nor where the moved pods may.
			why = fmt.Errorf("%w: the model cannot place it on the freed room", ErrNoPlan)
			continue
		}
		if !after.rehome(moves, w, place) {
			why = fmt.Errorf("%w: the %d pods it would move find no room elsewhere", ErrNoPlan, len(moves))
			// Pods that may run only where the workload goes: try
			// again without each node the model chose.
			tryWithout(g, moves)
			continue
		}
		if best == nil || len(moves) < len(best.Moves) {
			names := make([]string, len(place.nodes))
			for i, n := range place.nodes {
				names[i] = st.nodes[n].Name
			}
			best = &Plan{Moves: moves, Placement: names}
		}
	}
	if best == nil {
		return Plan{}, why
	}
	if len(best.Moves) > budget {
		return Plan{}, fmt.Errorf("%w: it needs %d moves, %d are left this minute", ErrBudget, len(best.Moves), budget)
	}
	return *best, nil
}

// prune gives back every move without which it still fits, last chosen
// first.
func prune(moves []Move, fits Fits) []Move {
	out := slices.Clone(moves)
	for i := len(out) - 1; i >= 0; i-- {
		try := slices.Delete(slices.Clone(out), i, i+1)
		if fits(try) {
			out = try
		}
	}
	return out
}

// targets are the nodes of group that moves free room on.
func (s *state) targets(moves []Move, group []int) []int {
	var out []int
	for _, n := range group {
		if slices.ContainsFunc(moves, func(m Move) bool { return m.Node == s.nodes[n].Name }) {
			out = append(out, n)
		}
	}
	return out
}

// state is the nodes with the GPUs each pod uses.
type state struct {
	nodes []Node
	// on[n][pos] are the pods (indices in nodes[n].Pods) on each GPU.
	on [][][]int
	// gone[n][k] marks pod k of node n moved.
	gone [][]bool
	// taken[n][pos] marks a GPU the workload's placement took.
	taken [][]bool
}

func newState(nodes []Node) *state {
	s := &state{nodes: nodes, on: make([][][]int, len(nodes)), gone: make([][]bool, len(nodes)), taken: make([][]bool, len(nodes))}
	for n, node := range nodes {
		s.on[n] = make([][]int, node.GPUs)
		s.gone[n] = make([]bool, len(node.Pods))
		s.taken[n] = make([]bool, node.GPUs)
		for k, p := range node.Pods {
			for _, pos := range p.GPUs {
				s.on[n][pos] = append(s.on[n][pos], k)
			}
		}
	}
	return s
}

// clone copies the marks (the nodes are shared, never modified).
func (s *state) clone() *state {
	c := &state{nodes: s.nodes, on: s.on, gone: make([][]bool, len(s.gone)), taken: make([][]bool, len(s.taken))}
	for n := range s.gone {
		c.gone[n] = slices.Clone(s.gone[n])
		c.taken[n] = slices.Clone(s.taken[n])
	}
	return c
}

// without is s with the pods of moved gone.
func (s *state) without(moved []Move) *state {
	c := s.clone()
	for _, m := range moved {
		for n, node := range s.nodes {
			if node.Name != m.Node {
				continue
			}
			for k, p := range node.Pods {
				if p.Name == m.Pod {
					c.gone[n][k] = true
				}
			}
		}
	}
	return c
}

// free reports whether GPU pos of node n is free (no pod left on it, not
// taken by the placement).
func (s *state) free(n, pos int) bool {
	if s.taken[n][pos] {
		return false
	}
	for _, k := range s.on[n][pos] {
		if !s.gone[n][k] {
			return false
		}
	}
	return true
}

// domains are the GPU sets of node n a member may use: its cliques when
// the member needs NVLink, else the whole node.
func (s *state) domains(n int, nvlink bool) [][]int {
	node := s.nodes[n]
	if nvlink && len(node.Cliques) > 0 {
		return node.Cliques
	}
	all := make([]int, node.GPUs)
	for i := range all {
		all[i] = i
	}
	return [][]int{all}
}

// freeIn counts the free GPUs of set on node n, less the node's unknown
// ones.
func (s *state) freeIn(n int, set []int) int {
	c := 0
	for _, pos := range set {
		if s.free(n, pos) {
			c++
		}
	}
	return max(c-s.nodes[n].Unknown, 0)
}

// groups are the sets of eligible nodes the workload may be placed on as a
// whole.
func (s *state) groups(w Workload) [][]int {
	var all []int
	byDomain := map[string][]int{}
	var names []string
	for n, node := range s.nodes {
		if !node.Eligible {
			continue
		}
		all = append(all, n)
		if _, ok := byDomain[node.Domain]; !ok {
			names = append(names, node.Domain)
		}
		byDomain[node.Domain] = append(byDomain[node.Domain], n)
	}
	if !w.OneDomain {
		if all == nil {
			return nil
		}
		return [][]int{all}
	}
	slices.Sort(names)
	out := make([][]int, 0, len(names))
	for _, d := range names {
		out = append(out, byDomain[d])
	}
	return out
}

// order is the members' indices, most GPUs first.
func order(w Workload) []int {
	idx := make([]int, len(w.Members))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int { return cmp.Compare(w.Members[b], w.Members[a]) })
	return idx
}

// placement is where the model puts each member.
type placement struct{ nodes []int }

// pack places w's members, most GPUs first, each on the node (of one
// group) whose domain leaves the fewest free GPUs; nil when one does not
// fit. It marks the GPUs taken in s.
func (s *state) pack(w Workload) *placement {
	for _, group := range s.groups(w) {
		c := s.clone()
		if p := c.packIn(w, group); p != nil {
			*s = *c
			return p
		}
	}
	return nil
}

func (s *state) packIn(w Workload, group []int) *placement {
	p := &placement{nodes: make([]int, len(w.Members))}
	for _, i := range order(w) {
		g := w.Members[i]
		bn, bset, bfree := -1, []int(nil), 0
		for _, n := range group {
			for _, set := range s.domains(n, w.NVLink) {
				f := s.freeIn(n, set)
				if f >= g && (bn < 0 || f < bfree) {
					bn, bset, bfree = n, set, f
				}
			}
		}
		if bn < 0 {
			return nil
		}
		s.take(bn, bset, g)
		p.nodes[i] = bn
	}
	return p
}

// take marks g free GPUs of set on node n taken, those of the smallest
// clique that holds them first.
func (s *state) take(n int, set []int, g int) {
	pick := func(within []int) bool {
		var got []int
		for _, pos := range within {
			if slices.Contains(set, pos) && s.free(n, pos) {
				got = append(got, pos)
			}
		}
		if len(got)-s.nodes[n].Unknown < g {
			return false
		}
		for _, pos := range got[:g] {
			s.taken[n][pos] = true
		}
		return true
	}
	cliques := slices.Clone(s.nodes[n].Cliques)
	slices.SortStableFunc(cliques, func(a, b []int) int { return cmp.Compare(len(a), len(b)) })
	for _, c := range cliques {
		if pick(c) {
			return
		}
	}
	pick(set)
}

// greedy places the members one by one, most GPUs first, each on the
// domain (of group's nodes) that needs the fewest moves to hold it, then
// leaves the fewest free GPUs, then by node name; it returns the moves.
func (s *state) greedy(w Workload, group []int) ([]Move, bool) {
	c := s.clone()
	var moves []Move
	for _, i := range order(w) {
		g := w.Members[i]
		bn, bset, bpods, bleft := -1, []int(nil), []int(nil), 0
		for _, n := range group {
			for _, set := range c.domains(n, w.NVLink) {
				pods, ok := c.toFree(n, set, g)
				if !ok {
					continue
				}
				for _, k := range pods {
					c.gone[n][k] = true
				}
				left := c.freeIn(n, set) - g
				for _, k := range pods {
					c.gone[n][k] = false
				}
				better := bn < 0 || len(pods) < len(bpods) ||
					len(pods) == len(bpods) && (left < bleft || left == bleft && c.nodes[n].Name < c.nodes[bn].Name)
				if better {
					bn, bset, bpods, bleft = n, set, pods, left
				}
			}
		}
		if bn < 0 {
			return nil, false
		}
		for _, k := range bpods {
			c.gone[bn][k] = true
			p := c.nodes[bn].Pods[k]
			moves = append(moves, Move{Node: c.nodes[bn].Name, Pod: p.Name, GPUs: len(p.GPUs)})
		}
		c.take(bn, bset, g)
	}
	return moves, true
}

// toFree chooses movable pods of node n whose moves leave g GPUs of set
// free: each time the pod that frees the most GPUs of set (then the one
// on the most of them), until enough are free; then every pod chosen
// without which enough are still free is given back.
func (s *state) toFree(n int, set []int, g int) ([]int, bool) {
	if s.freeIn(n, set) >= g {
		return nil, true
	}
	if len(set)-s.nodes[n].Unknown < g {
		return nil, false
	}
	c := s.clone()
	var chosen []int
	for c.freeIn(n, set) < g {
		best, bfreed, bon := -1, 0, 0
		for k, p := range c.nodes[n].Pods {
			if c.gone[n][k] || !p.Movable {
				continue
			}
			on := 0
			for _, pos := range p.GPUs {
				if slices.Contains(set, pos) && !c.taken[n][pos] {
					on++
				}
			}
			if on == 0 {
				continue
			}
			c.gone[n][k] = true
			freed := c.freeIn(n, set)
			c.gone[n][k] = false
			if best < 0 || freed > bfreed || freed == bfreed && on > bon {
				best, bfreed, bon = k, freed, on
			}
		}
		if best < 0 {
			return nil, false
		}
		c.gone[n][best] = true
		chosen = append(chosen, best)
	}
	for i := len(chosen) - 1; i >= 0; i-- {
		k := chosen[i]
		c.gone[n][k] = false
		if c.freeIn(n, set) >= g {
			chosen = slices.Delete(chosen, i, i+1)
			continue
		}
		c.gone[n][k] = true
	}
	return chosen, true
}

// rehome reports whether every moved pod finds room on one node it may run
// on, on GPUs left free once the workload is placed (s has its placement
// taken, place its nodes), in one NVLink clique when it needs one, and with
// its CPU and memory free there; the largest first (of equal size, the
// ones that may run on fewer nodes first), each where it leaves the
// fewest free GPUs in its domain. A slice counts as needing a whole GPU.
func (s *state) rehome(moves []Move, w Workload, place *placement) bool {
	c := s.clone()
	cpu := make([]int64, len(s.nodes))
	mem := make([]int64, len(s.nodes))
	for n, node := range s.nodes {
		cpu[n], mem[n] = node.CPUMilli, node.MemMiB
	}
	for i, n := range place.nodes {
		if w.CPUMilli != nil {
			cpu[n] -= w.CPUMilli[i]
		}
		if w.MemMiB != nil {
			mem[n] -= w.MemMiB[i]
		}
	}
	type mover struct {
		gpus     int
		cpu, mem int64
		nvlink   bool
		may      func(string) bool
		hosts    int
	}
	movers := make([]mover, len(moves))
	for i, m := range moves {
		p, from := s.pod(m)
		if from >= 0 {
			cpu[from] += p.CPUMilli
			mem[from] += p.MemMiB
		}
		mv := mover{gpus: max(m.GPUs, 1), cpu: p.CPUMilli, mem: p.MemMiB, nvlink: p.NVLink, may: p.MayRunOn, hosts: len(s.nodes)}
		if mv.may != nil {
			mv.hosts = 0
			for n := range s.nodes {
				if mv.may(s.nodes[n].Name) {
					mv.hosts++
				}
			}
		}
		movers[i] = mv
	}
	slices.SortStableFunc(movers, func(a, b mover) int {
		return cmp.Or(cmp.Compare(b.gpus, a.gpus), cmp.Compare(a.hosts, b.hosts))
	})
	for _, mv := range movers {
		bn, bset, bfree := -1, []int(nil), 0
		for n := range s.nodes {
			if cpu[n] < mv.cpu || mem[n] < mv.mem || (mv.may != nil && !mv.may(s.nodes[n].Name)) {
				continue
			}
			for _, set := range c.domains(n, mv.nvlink) {
				if f := c.freeIn(n, set); f >= mv.gpus && (bn < 0 || f < bfree) {
					bn, bset, bfree = n, set, f
				}
			}
		}
		if bn < 0 {
			return false
		}
		c.take(bn, bset, mv.gpus)
		cpu[bn] -= mv.cpu
		mem[bn] -= mv.mem
	}
	return true
}

// pod is the pod m moves and the index of its node (-1: none).
func (s *state) pod(m Move) (Pod, int) {
	for n, node := range s.nodes {
		if node.Name != m.Node {
			continue
		}
		for _, p := range node.Pods {
			if p.Name == m.Pod {
				return p, n
			}
		}
	}
	return Pod{}, -1
}
