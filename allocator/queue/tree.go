// Package queue is the pure core of hierarchical workload queues (issue
// 15): a tree of queues (department → team → ...) that each guarantee,
// limit and weigh resources; fair share by hierarchical water-filling;
// decayed usage history; the order in which waiting workloads go; admission
// with borrowing; and reclaim and preemption that never take a queue below
// its guarantee. It does no I/O: the extender feeds it Queue objects and
// running work, and acts on its answers.
//
// Amounts are quota.Resources (whole GPUs, memory and core units, ...).
// One concern per file: tree.go (the shape and its validity), state.go (what
// the other questions read), fairshare.go, usage.go, order.go, admit.go,
// reclaim.go.
package queue

import (
	"fmt"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/tessera-gpu/tessera/allocator/quota"
)

// MaxDepth is how many levels a tree may have; a queue deeper than this is
// invalid.
const MaxDepth = 8

// Spec is one queue as its object declares it.
type Spec struct {
	// Name is the queue's name, unique in the tree.
	Name string
	// Parent is the parent queue's name; "" for a top-level queue.
	Parent string
	// Namespaces are the namespaces whose workloads go to this queue.
	// Only leaf queues admit work.
	Namespaces []string
	// Guaranteed is what the queue gets whenever it asks; a resource
	// missing is 0.
	Guaranteed quota.Resources
	// Limit caps the queue's use, borrowing included; a resource missing
	// is unlimited.
	Limit quota.Resources
	// Weight is the queue's part of what is lent beyond guarantees, among
	// its siblings; a resource missing weighs 1, and weight 0 borrows
	// nothing beyond the guarantee.
	Weight map[corev1.ResourceName]int64
	// Malformed, when set, says why the queue's object could not be read:
	// the queue is invalid and admits nothing (fail closed: a broken
	// object never lets its namespaces run unqueued, whatever resource
	// they ask for).
	Malformed string
}

// Tree is a validated set of queues. Build never fails as a whole: a queue
// that is unusable says why through Invalid, admits nothing (fail closed),
// and its running work still counts everywhere.
type Tree struct {
	nodes map[string]*node
	// order lists every queue with parents before children, siblings by
	// name.
	order    []string
	roots    []string
	ns       map[string]string
	invalid  map[string]string
	warnings []string
}

type node struct {
	spec     Spec
	parent   string // "" for a top-level queue or one detached from a bad parent
	children []string
	path     []string // root first, ending with the queue
}

// Build builds the tree of specs. Rules, each making the named queues
// invalid:
//   - a name defined twice (the first definition is kept);
//   - a negative guarantee, limit or weight, or a guarantee above the
//     queue's own limit;
//   - a parent that is not defined (the queue becomes top level);
//   - a cycle of parents (every queue in it; each becomes top level);
//   - a queue deeper than MaxDepth levels;
//   - a namespace claimed by two queues (both);
//   - children whose guarantees sum above their parent's limit (the
//     children).
//
// Children whose guarantees sum above their parent's guarantee only warn
// (Warnings): the parent's guarantee is what the level above reserves for
// the subtree. A queue under an invalid ancestor is invalid too.
func Build(specs []Spec) *Tree {
	t := &Tree{nodes: map[string]*node{}, ns: map[string]string{}, invalid: map[string]string{}}
	for _, sp := range specs {
		if sp.Name == "" {
			t.warn("a queue without a name is ignored")
			continue
		}
		if _, dup := t.nodes[sp.Name]; dup {
			t.markInvalid(sp.Name, fmt.Sprintf("queue %s is defined more than once", sp.Name))
			continue
		}
		t.nodes[sp.Name] = &node{spec: sp}
		if sp.Malformed != "" {
			t.markInvalid(sp.Name, sp.Malformed)
		}
	}
	for _, name := range t.Names() {
		t.checkQuantities(name)
	}
	t.linkParents()
	t.buildOrder()
	for _, name := range t.order {
		if n := t.nodes[name]; len(n.path) > MaxDepth {
			t.markInvalid(name, fmt.Sprintf("queue %s is %d levels deep (%s), deeper than %d", name, len(n.path), strings.Join(n.path, "/"), MaxDepth))
		}
	}
	t.claimNamespaces()
	t.checkGuarantees()
	return t
}

func (t *Tree) warn(msg string) { t.warnings = append(t.warnings, msg) }

// markInvalid records why a queue is invalid; the first reasons are kept,
// further ones appended.
func (t *Tree) markInvalid(name, why string) {
	if old, ok := t.invalid[name]; ok {
		if !strings.Contains(old, why) {
			t.invalid[name] = old + "; " + why
		}
		return
	}
	t.invalid[name] = why
}

func (t *Tree) checkQuantities(name string) {
	sp := t.nodes[name].spec
	for _, r := range sortedNames(sp.Guaranteed) {
		if sp.Guaranteed[r] < 0 {
			t.markInvalid(name, fmt.Sprintf("queue %s guarantees %d %s, below 0", name, sp.Guaranteed[r], r))
		}
	}
	for _, r := range sortedNames(sp.Limit) {
		if sp.Limit[r] < 0 {
			t.markInvalid(name, fmt.Sprintf("queue %s limits %s to %d, below 0", name, r, sp.Limit[r]))
		} else if g := sp.Guaranteed[r]; g > sp.Limit[r] {
			t.markInvalid(name, fmt.Sprintf("queue %s guarantees %d %s, above its limit %d", name, g, r, sp.Limit[r]))
		}
	}
	for _, r := range sortedNames(sp.Weight) {
		if sp.Weight[r] < 0 {
			t.markInvalid(name, fmt.Sprintf("queue %s weighs %s %d, below 0", name, r, sp.Weight[r]))
		}
	}
}

// linkParents sets each queue's parent, detaching (making top level) a
// queue whose parent is not defined and every queue on a cycle.
func (t *Tree) linkParents() {
	for name, n := range t.nodes {
		p := n.spec.Parent
		if p == "" {
			continue
		}
		if _, ok := t.nodes[p]; !ok {
			t.markInvalid(name, fmt.Sprintf("queue %s's parent %s is not defined", name, p))
			continue
		}
		n.parent = p
	}
	for _, name := range t.Names() {
		cycle := t.cycleFrom(name)
		if cycle == nil {
			continue
		}
		why := "parent cycle " + strings.Join(append(cycle, cycle[0]), " → ")
		for _, c := range cycle {
			t.markInvalid(c, fmt.Sprintf("queue %s is on a %s", c, why))
		}
		for _, c := range cycle {
			t.nodes[c].parent = ""
		}
	}
}

// cycleFrom returns the cycle of parents name is on, starting at name, or
// nil.
func (t *Tree) cycleFrom(name string) []string {
	seen := map[string]int{}
	var chain []string
	for cur := name; cur != ""; cur = t.nodes[cur].parent {
		if i, ok := seen[cur]; ok {
			if i == 0 {
				return chain
			}
			return nil // name leads into a cycle it is not on
		}
		seen[cur] = len(chain)
		chain = append(chain, cur)
	}
	return nil
}

func (t *Tree) buildOrder() {
	for _, name := range t.Names() {
		n := t.nodes[name]
		if n.parent == "" {
			t.roots = append(t.roots, name)
		} else {
			p := t.nodes[n.parent]
			p.children = append(p.children, name)
		}
	}
	var walk func(name string, path []string)
	walk = func(name string, path []string) {
		n := t.nodes[name]
		n.path = append(append([]string(nil), path...), name)
		t.order = append(t.order, name)
		for _, c := range n.children {
			walk(c, n.path)
		}
	}
	for _, r := range t.roots {
		walk(r, nil)
	}
}

func (t *Tree) claimNamespaces() {
	claims := map[string][]string{}
	for _, name := range t.order {
		n := t.nodes[name]
		seen := map[string]bool{}
		for _, ns := range n.spec.Namespaces {
			if ns == "" || seen[ns] {
				continue
			}
			seen[ns] = true
			claims[ns] = append(claims[ns], name)
		}
		if len(n.children) > 0 && len(seen) > 0 {
			t.warn(fmt.Sprintf("queue %s has child queues and serves namespaces; only leaf queues admit work", name))
		}
	}
	for ns, qs := range claims {
		sort.Strings(qs)
		// The first claimer answers QueueOf, so the namespace stays
		// governed by an invalid queue (fail closed).
		t.ns[ns] = qs[0]
		if len(qs) == 1 {
			continue
		}
		for _, q := range qs {
			t.markInvalid(q, fmt.Sprintf("namespace %s is claimed by queues %s", ns, strings.Join(qs, ", ")))
		}
	}
}

func (t *Tree) checkGuarantees() {
	for _, name := range t.order {
		n := t.nodes[name]
		if len(n.children) == 0 {
			continue
		}
		sum := quota.Resources{}
		for _, c := range n.children {
			sum = sum.Add(t.nodes[c].spec.Guaranteed)
		}
		for _, r := range sortedNames(sum) {
			if lim, ok := n.spec.Limit[r]; ok && sum[r] > lim {
				for _, c := range n.children {
					t.markInvalid(c, fmt.Sprintf("the guarantees of %s's children sum to %d %s, above %s's limit %d", name, sum[r], r, name, lim))
				}
				continue
			}
			if g := n.spec.Guaranteed[r]; sum[r] > g {
				t.warn(fmt.Sprintf("the guarantees of %s's children sum to %d %s, above %s's guarantee %d: the children get them only as %s's share allows", name, sum[r], r, name, g, name))
			}
		}
	}
}

// Invalid says why a queue admits nothing: its own fault, or an invalid
// ancestor's. It is "" for a usable queue.
func (t *Tree) Invalid(name string) string {
	n, ok := t.node(name)
	if !ok {
		return fmt.Sprintf("queue %s is not defined", name)
	}
	for _, q := range n.path {
		why, bad := t.invalid[q]
		if !bad {
			continue
		}
		if q == name {
			return why
		}
		return fmt.Sprintf("queue %s is under invalid queue %s: %s", name, q, why)
	}
	return ""
}

// Warnings are the tree's problems that do not make a queue invalid, in
// the order found.
func (t *Tree) Warnings() []string {
	if t == nil {
		return nil
	}
	return append([]string(nil), t.warnings...)
}

// QueueOf returns the queue serving a namespace. A namespace claimed by two
// queues answers the first by name (which is invalid, so its work is
// refused rather than ungoverned).
func (t *Tree) QueueOf(namespace string) (string, bool) {
	if t == nil {
		return "", false
	}
	q, ok := t.ns[namespace]
	return q, ok
}

// Path returns the queues from the top level down to name, or nil for an
// unknown queue.
func (t *Tree) Path(name string) []string {
	n, ok := t.node(name)
	if !ok {
		return nil
	}
	return append([]string(nil), n.path...)
}

// Parent returns a queue's parent as the tree links it: "" for a top-level
// queue and for one detached from an undefined parent or a cycle.
func (t *Tree) Parent(name string) string {
	if n, ok := t.node(name); ok {
		return n.parent
	}
	return ""
}

// Children returns a queue's children, sorted; with name "" the top-level
// queues.
func (t *Tree) Children(name string) []string {
	if t == nil {
		return nil
	}
	if name == "" {
		return append([]string(nil), t.roots...)
	}
	if n, ok := t.node(name); ok {
		return append([]string(nil), n.children...)
	}
	return nil
}

// Leaves returns the queues without children, sorted.
func (t *Tree) Leaves() []string {
	var out []string
	for _, name := range t.Names() {
		if len(t.nodes[name].children) == 0 {
			out = append(out, name)
		}
	}
	return out
}

// Names returns every queue, sorted.
func (t *Tree) Names() []string {
	if t == nil {
		return nil
	}
	out := make([]string, 0, len(t.nodes))
	for name := range t.nodes {
		out = append(out, name)
	}
	sort.Strings(out)
	return out
}

// Spec returns a queue's spec as given.
func (t *Tree) Spec(name string) (Spec, bool) {
	n, ok := t.node(name)
	if !ok {
		return Spec{}, false
	}
	return n.spec, true
}

func (t *Tree) node(name string) (*node, bool) {
	if t == nil {
		return nil, false
	}
	n, ok := t.nodes[name]
	return n, ok
}

// isLeaf reports whether a known queue has no children.
func (t *Tree) isLeaf(name string) bool {
	n, ok := t.node(name)
	return ok && len(n.children) == 0
}

// weight is a queue's weight for r: 1 when unset.
func (sp Spec) weight(r corev1.ResourceName) int64 {
	if w, ok := sp.Weight[r]; ok {
		return max(w, 0)
	}
	return 1
}
