// Package gang plans a group of pods (a gang) all-or-nothing: every member
// gets a node (and, for shared members, a GPU) in one consistent plan, or the
// group gets nothing. It is pure policy: it takes snapshots of nodes and
// returns a plan; the scheduler extender reserves the plan and pins each pod.
//
// Placement is topology-aware at two scales:
//   - inside a node, a member that needs several whole GPUs goes where they
//     can come from one NVLink clique when any node can offer that, so the
//     node's preferred allocation can give it one;
//   - across nodes, the group goes under the lowest level of an ordered list
//     of node label keys (e.g. NVLink domain, network block, rack) where one
//     domain has room for all of it, then the next level up.
package gang

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/tessera-gpu/tessera/allocator"
)

// Member is one pod of a group.
type Member struct {
	// Name identifies the member (the pod's name).
	Name    string
	Request allocator.Request
	// NVLink requires the member's whole GPUs to come from one NVLink
	// clique; without it the clique is preferred, not required.
	NVLink bool
	// Allowed, when set, says whether the member may run on a node at all
	// (its node selector and required node affinity); nil: on any node.
	Allowed func(Node) bool
}

// Level is one level of the cluster's topology: a node label key whose
// values name domains (racks, blocks, NVLink domains).
type Level struct {
	Key string
	// Required makes the group land in one domain of this level or not at
	// all; otherwise the level is preferred.
	Required bool
}

// Group is a gang to plan.
type Group struct {
	Namespace string
	Name      string
	// MinMember is how many members must exist before the group is planned;
	// every listed member is planned.
	MinMember int
	Members   []Member
	// Levels are the topology levels, lowest (most local) first.
	Levels []Level
	// Single marks a pod outside any gang planned as a group of one (a
	// queued pod): errors name it as a pod.
	Single bool
}

// Node is a node as the planner sees it.
type Node struct {
	Node   *allocator.Node
	Labels map[string]string
	// Cliques are the node's NVLink cliques as device indices
	// (allocator.GPU.Index), as topology.Topology.NVLinkCliques.
	Cliques [][]int
	// Admit, when set, reports whether the members (indices in
	// Group.Members) can be placed on the node together by a rule the
	// allocator view does not hold, such as NUMA alignment (the extender's
	// allocator/numa check). It is asked for each member the plan puts on
	// the node, with the members put there before it.
	Admit func(members []int) bool
}

// Placement is one member's place in a plan.
type Placement struct {
	Member string
	Node   string
	// GPUs are the GPUs the plan counts the member on (positions in the
	// node's allocator.Node.GPUs). For whole GPUs the node's device plugin
	// makes the final choice; the plan only guarantees that many are free,
	// from one clique where InClique is set.
	GPUs     allocator.GPUSet
	InClique bool
}

// Plan is a placement of every member of a group.
type Plan struct {
	// Placements are in the order of Group.Members.
	Placements []Placement
	// Level and Domain name where the group landed: a label key and its
	// value; both empty when the group spans the cluster.
	Level, Domain string
	// Unlabelled are the group's preferred levels that none of the nodes
	// carries (a mistyped label key, say): the group was planned as if
	// they were not given.
	Unlabelled []string
}

// ErrIncomplete: fewer members exist than the group's minimum.
var ErrIncomplete = errors.New("group is incomplete")

// ErrNoRoom: the whole group fits nowhere now.
var ErrNoRoom = errors.New("no room for the whole group")

// Error says why a group could not be planned; it matches ErrIncomplete or
// ErrNoRoom with errors.Is.
type Error struct {
	Group  string
	Kind   error
	Detail string
	// Single: the group is one pod outside any gang (Group.Single).
	Single bool
}

func (e *Error) Error() string {
	if e.Single && errors.Is(e.Kind, ErrNoRoom) {
		return fmt.Sprintf("pod %s: no room: %s", e.Group, e.Detail)
	}
	return fmt.Sprintf("gang %s: %v: %s", e.Group, e.Kind, e.Detail)
}

// Unwrap returns the kind, ErrIncomplete or ErrNoRoom.
func (e *Error) Unwrap() error { return e.Kind }

// PlanGroup plans every member of g on nodes, or returns an *Error. The
// snapshots are not modified. p scores nodes as it does for single pods.
func PlanGroup(g Group, nodes []Node, p allocator.Policy) (*Plan, error) {
	name := g.Namespace + "/" + g.Name
	if g.MinMember < 1 {
		return nil, &Error{Group: name, Kind: ErrIncomplete, Detail: fmt.Sprintf("minMember is %d, must be at least 1", g.MinMember)}
	}
	if len(g.Members) < g.MinMember {
		return nil, &Error{Group: name, Kind: ErrIncomplete, Detail: fmt.Sprintf("%d of %d members exist", len(g.Members), g.MinMember)}
	}
	for _, m := range g.Members {
		if err := m.Request.Validate(); err != nil {
			return nil, fmt.Errorf("gang %s: member %s: %w", name, m.Name, err)
		}
	}
	order := memberOrder(g.Members)
	need := demand(g.Members)
	var tried []string
	for _, d := range domains(nodes, g.Levels) {
		if d.freeWhole < need.wholeGPUs || d.freeMilli < need.milli {
			tried = append(tried, d.describe())
			continue
		}
		if placements, ok := planIn(g.Members, order, nodes, d.nodes, p); ok {
			return &Plan{Placements: placements, Level: d.level, Domain: d.value, Unlabelled: unlabelled(g.Levels, nodes)}, nil
		}
		tried = append(tried, d.describe())
	}
	return nil, &Error{Group: name, Kind: ErrNoRoom, Detail: noRoomDetail(g, need, tried), Single: g.Single}
}

// unlabelled are the keys of levels that no node carries.
func unlabelled(levels []Level, nodes []Node) []string {
	var out []string
	for _, l := range levels {
		if !slices.ContainsFunc(nodes, func(n Node) bool { _, ok := n.Labels[l.Key]; return ok }) {
			out = append(out, l.Key)
		}
	}
	return out
}

type groupDemand struct {
	wholeGPUs int
	milli     int64
}

func demand(members []Member) groupDemand {
	var d groupDemand
	for _, m := range members {
		d.wholeGPUs += m.Request.GPUs
		d.milli += m.Request.TotalGPUMilli()
	}
	return d
}

func noRoomDetail(g Group, need groupDemand, tried []string) string {
	var b strings.Builder
	gpus := fmt.Sprintf("%d whole GPUs and %.1f GPUs in all", need.wholeGPUs, float64(need.milli)/allocator.MilliPerGPU)
	if need.wholeGPUs == 1 {
		gpus = fmt.Sprintf("1 whole GPU and %.1f GPUs in all", float64(need.milli)/allocator.MilliPerGPU)
	}
	switch {
	case g.Single:
		fmt.Fprintf(&b, "it needs %s", gpus)
	case len(g.Members) == 1:
		fmt.Fprintf(&b, "1 member needs %s", gpus)
	default:
		fmt.Fprintf(&b, "%d members need %s", len(g.Members), gpus)
	}
	for _, l := range g.Levels {
		if l.Required {
			fmt.Fprintf(&b, " within one %s", l.Key)
			if len(tried) == 0 {
				// No domain at all: however free the nodes are, none can
				// hold the group until one carries the label.
				fmt.Fprintf(&b, ", and no node it may use has the label %s", l.Key)
			}
			break
		}
	}
	const shown = 5
	if len(tried) > 0 {
		fmt.Fprintf(&b, "; tried %s", strings.Join(tried[:min(len(tried), shown)], ", "))
		if len(tried) > shown {
			fmt.Fprintf(&b, " and %d more", len(tried)-shown)
		}
	}
	return b.String()
}

// memberOrder plans the hardest members first: most GPUs, then most GPU
// compute, CPU and memory, then by name.
func memberOrder(members []Member) []int {
	order := make([]int, len(members))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool {
		ra, rb := members[order[a]].Request, members[order[b]].Request
		switch {
		case ra.GPUs != rb.GPUs:
			return ra.GPUs > rb.GPUs
		case ra.TotalGPUMilli() != rb.TotalGPUMilli():
			return ra.TotalGPUMilli() > rb.TotalGPUMilli()
		case ra.CPUMilli != rb.CPUMilli:
			return ra.CPUMilli > rb.CPUMilli
		case ra.MemMiB != rb.MemMiB:
			return ra.MemMiB > rb.MemMiB
		}
		return members[order[a]].Name < members[order[b]].Name
	})
	return order
}

// planIn places every member on the nodes of one domain, in order, each on
// the node the policy scores best among those that fit it after the members
// before it. It reports false when some member fits nowhere.
func planIn(members []Member, order []int, all []Node, domain []int, p allocator.Policy) ([]Placement, bool) {
	clones := map[int]*allocator.Node{}
	snapshot := func(i int) *allocator.Node {
		if c, ok := clones[i]; ok {
			return c
		}
		return all[i].Node
	}
	placements := make([]Placement, len(members))
	on := map[int][]int{} // members placed on each node
	for _, mi := range order {
		m := members[mi]
		type candidate struct {
			node   int
			eval   allocator.Evaluation
			clique allocator.GPUSet
		}
		var inClique, others []candidate
		for _, ni := range domain {
			if m.Allowed != nil && !m.Allowed(all[ni]) {
				continue
			}
			n := snapshot(ni)
			if allocator.Fit(n, m.Request) != allocator.Fits {
				continue
			}
			if all[ni].Admit != nil && !all[ni].Admit(append(slices.Clone(on[ni]), mi)) {
				continue
			}
			c := candidate{node: ni, eval: p.Evaluate(n, m.Request)}
			if m.Request.GPUs > 1 {
				c.clique = cliqueSet(n, all[ni].Cliques, m.Request.GPUs)
			}
			if c.clique != 0 {
				inClique = append(inClique, c)
			} else {
				others = append(others, c)
			}
		}
		cands := inClique
		if len(cands) == 0 {
			if m.NVLink && m.Request.GPUs > 1 {
				return nil, false
			}
			cands = others
		}
		if len(cands) == 0 {
			return nil, false
		}
		best := cands[0]
		for _, c := range cands[1:] {
			if c.eval.Score > best.eval.Score || (c.eval.Score == best.eval.Score && all[c.node].Node.Name < all[best.node].Node.Name) {
				best = c
			}
		}
		gpus := best.eval.GPUs
		if best.clique != 0 {
			gpus = best.clique
		}
		n := snapshot(best.node)
		if _, cloned := clones[best.node]; !cloned {
			n = n.Clone()
			clones[best.node] = n
		}
		if err := allocator.Apply(n, m.Request, gpus); err != nil {
			return nil, false
		}
		placements[mi] = Placement{Member: m.Name, Node: n.Name, GPUs: gpus, InClique: best.clique != 0}
		on[best.node] = append(on[best.node], mi)
	}
	return placements, true
}

// cliqueSet returns k fully free GPUs of n inside one NVLink clique, from the
// smallest clique that has k free (the tightest fit), or 0 when none has.
func cliqueSet(n *allocator.Node, cliques [][]int, k int) allocator.GPUSet {
	pos := make(map[int]int, len(n.GPUs))
	for i, g := range n.GPUs {
		pos[g.Index] = i
	}
	var best allocator.GPUSet
	bestFree := 0
	for _, clique := range cliques {
		if len(clique) < k {
			continue
		}
		var free allocator.GPUSet
		for _, idx := range clique {
			if i, ok := pos[idx]; ok && n.GPUs[i].FullyFree() {
				free = free.With(i)
			}
		}
		if free.Len() < k || (best != 0 && free.Len() >= bestFree) {
			continue
		}
		var pick allocator.GPUSet
		for _, i := range free.Positions()[:k] {
			pick = pick.With(i)
		}
		best, bestFree = pick, free.Len()
	}
	return best
}
