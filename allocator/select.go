package allocator

import "fmt"

// Rejections counts, per Reason, the nodes a request did not fit.
type Rejections [numReasons]int

// Count returns how many nodes were rejected for reason r.
func (c *Rejections) Count(r Reason) int {
	if int(r) >= len(c) {
		return 0
	}
	return c[r]
}

// Total returns how many nodes were rejected.
func (c *Rejections) Total() int {
	t := 0
	for _, v := range c[1:] {
		t += v
	}
	return t
}

// String renders the non-zero counts like the scheduler's FitError,
// e.g. "3 insufficient-cpu, 1 no-gpu-for-slice".
func (c *Rejections) String() string {
	s := ""
	for _, r := range Reasons() {
		if v := c.Count(r); v > 0 {
			if s != "" {
				s += ", "
			}
			s += fmt.Sprintf("%d %s", v, r)
		}
	}
	return s
}

// Selection is the result of Select.
type Selection struct {
	// Node is the index of the chosen node in the slice given to Select,
	// or -1 when the request fits no node.
	Node       int
	Evaluation Evaluation
	Rejected   Rejections
}

// Preferred reports whether a node with evaluation a and tie-break rank
// ra beats one with b and rb: a higher score wins, equal scores go to the
// lower rank (the artifact's scheduler picks the smallest node name).
func Preferred(a Evaluation, ra int, b Evaluation, rb int) bool {
	if a.Score != b.Score {
		return a.Score > b.Score
	}
	return ra < rb
}

// Select evaluates every node r fits with policy p and returns the best.
// rank[i] is node i's tie-break rank (lower wins on equal scores); when
// rank is nil, ties go to the smallest node name. It fails only when rank
// has the wrong length.
func Select(p Policy, nodes []*Node, r Request, rank []int) (Selection, error) {
	if rank != nil && len(rank) != len(nodes) {
		return Selection{Node: -1}, fmt.Errorf("select: %d tie-break ranks for %d nodes", len(rank), len(nodes))
	}
	sel := Selection{Node: -1}
	for i, n := range nodes {
		if reason := Fit(n, r); reason != Fits {
			sel.Rejected[reason]++
			continue
		}
		ev := p.Evaluate(n, r)
		if sel.Node < 0 {
			sel.Node, sel.Evaluation = i, ev
			continue
		}
		var better bool
		if rank != nil {
			better = Preferred(ev, rank[i], sel.Evaluation, rank[sel.Node])
		} else if ev.Score != sel.Evaluation.Score {
			better = ev.Score > sel.Evaluation.Score
		} else {
			better = n.Name < nodes[sel.Node].Name
		}
		if better {
			sel.Node, sel.Evaluation = i, ev
		}
	}
	return sel, nil
}
