// Package reserve decides reservations for large waiting workloads, so that
// backfill does not starve them: which waiting job gets a reservation, which
// nodes are held for it, and whether another job may start on a held node.
//
// It works on what a scheduler knows: the GPUs in use on each node, which of
// them were started inside a reservation (preemptible or backfilled by
// estimate), how long each running pod has run, the run time each workload
// declared (if any; estimate.go) and how long each waiting job has waited.
// The simulator (sim/jobs, strategy reserve) and the scheduler extender
// call the same functions.
//
// The scheme is EASY backfill: a reservation for the first Policy.Max jobs
// in queue order that are due (large enough, waited long enough). It holds
// the nodes that will hold the job soonest: with Policy.Estimates, those
// that drain first by the running work's estimates, else those with the
// fewest GPUs still to drain. Other jobs start outside the held nodes
// freely; inside them when they end before the reservation starts by their
// estimate (Admit), or, when Policy.Preemptible, as preemptible backfill
// evicted when the held nodes can otherwise take the job.
package reserve

import (
	"fmt"
	"sort"
	"time"
)

// Order breaks ties between nodes with as many GPUs still to drain.
type Order string

// Orders.
const (
	// OrderYoungest prefers the node whose longest-running occupant has run
	// the shortest time: with heavy-tailed run times, the longer a job has
	// run, the longer it is likely still to run.
	OrderYoungest Order = "youngest"
	// OrderOldest prefers the node whose longest-running occupant has run
	// the longest.
	OrderOldest Order = "oldest"
	// OrderName uses only the node name.
	OrderName Order = "name"
)

// Policy says which jobs get a reservation and how it is held.
type Policy struct {
	// MinGPUs: smaller jobs never get a reservation.
	MinGPUs int
	// A job is due once it has waited Wait + WaitPerGPU x its GPUs.
	Wait       time.Duration
	WaitPerGPU time.Duration
	// Relative adds this many times the wait of the longest-waiting job
	// smaller than MinGPUs: a big job is due when it waits that much
	// longer than the small ones, i.e. when backfill is passing it, not
	// when the whole queue is slow.
	Relative float64
	// Preemptible lets other jobs start on the held nodes' free GPUs; they
	// are marked preemptible and evicted when the reservation fills.
	// Otherwise held GPUs stay idle until the job starts.
	Preemptible bool
	// Order breaks ties between nodes (default OrderYoungest).
	Order Order
	// ByAge ranks nodes by the run time of their longest-running pod still
	// to drain before the GPUs still to drain (a node of short-lived pods
	// first).
	ByAge bool
	// Max is the number of jobs that hold reservations at once, on
	// disjoint nodes, in queue order (0 means 1).
	Max int
	// Estimates uses declared run times (estimate.go): nodes are ranked by
	// when their work ends by its estimates, and a job whose estimate
	// ends before a reservation starts may backfill on its GPUs.
	Estimates bool
	// ShortFirst tries waiting jobs by their response ratio, highest
	// first (Priority: short jobs first, long ones as they age), instead
	// of in arrival order.
	ShortFirst bool
	// Undeclared is the run time Priority assumes for a job that declared
	// none (0: DefaultUndeclared).
	Undeclared time.Duration
	// OverdueFirst gives free reservation slots to the due jobs that are
	// most overdue (waited minus DueAfter), not to the first due jobs in
	// queue order: with ShortFirst, a long big job's response ratio grows
	// slowly, and due jobs of shorter run times would otherwise take the
	// slot before it again and again.
	OverdueFirst bool
	// Backlog adds this many times the job's backlog wait (BacklogWait):
	// how long the work ahead of it when it arrived kept the whole
	// cluster busy, i.e. about when arrival order would have started it.
	// A big job is then due only once backfill has made it wait longer
	// than that: on a cluster loaded far beyond its capacity the bar rises
	// with the load, on a lightly loaded one it stays near Wait.
	Backlog float64
	// MaxShare caps reservations by how much of the cluster big jobs
	// already use: no new reservation is made while jobs of MinGPUs or
	// more run on more than this share of the GPUs (0: no cap). Backfill
	// alone may still run them beyond it.
	MaxShare float64
}

// MayHold reports whether a new reservation may be made while big jobs
// (MinGPUs or more) run on bigGPUs of the cluster's capacity GPUs.
func (p Policy) MayHold(bigGPUs, capacity int) bool {
	return p.MaxShare <= 0 || capacity <= 0 || float64(bigGPUs) <= p.MaxShare*float64(capacity)
}

// DefaultUndeclared is the run time assumed for a job that declared none:
// the longest usual limit, 30 days.
const DefaultUndeclared = 30 * 24 * time.Hour

// Validate reports a policy that cannot work.
func (p Policy) Validate() error {
	if p.MinGPUs < 1 {
		return fmt.Errorf("reserve: MinGPUs %d: want at least 1", p.MinGPUs)
	}
	if p.Relative < 0 {
		return fmt.Errorf("reserve: Relative %v: want 0 or more", p.Relative)
	}
	if p.Backlog < 0 {
		return fmt.Errorf("reserve: Backlog %v: want 0 or more", p.Backlog)
	}
	if p.Max < 0 {
		return fmt.Errorf("reserve: Max %d: want 0 or more", p.Max)
	}
	if p.MaxShare < 0 || p.MaxShare > 1 {
		return fmt.Errorf("reserve: MaxShare %v: want 0 (no cap) to 1", p.MaxShare)
	}
	if p.Undeclared < 0 {
		return fmt.Errorf("reserve: Undeclared %v: want 0 or more", p.Undeclared)
	}
	if p.Wait < 0 || p.WaitPerGPU < 0 {
		return fmt.Errorf("reserve: waits %v + %v per GPU: want 0 or more", p.Wait, p.WaitPerGPU)
	}
	switch p.Order {
	case "", OrderYoungest, OrderOldest, OrderName:
	default:
		return fmt.Errorf("reserve: order %q: want %s, %s or %s", p.Order, OrderYoungest, OrderOldest, OrderName)
	}
	return nil
}

// DueAfter is how long a job of gpus GPUs waits before it is due a
// reservation, when the longest-waiting job smaller than MinGPUs has waited
// smallWaited; ok is false when it never is (smaller than MinGPUs).
func (p Policy) DueAfter(gpus int, smallWaited time.Duration) (wait time.Duration, ok bool) {
	return p.DueAfterBacklog(gpus, smallWaited, 0)
}

// DueAfterBacklog is DueAfter for a job whose backlog wait (BacklogWait)
// is backlog.
func (p Policy) DueAfterBacklog(gpus int, smallWaited, backlog time.Duration) (wait time.Duration, ok bool) {
	if gpus < p.MinGPUs {
		return 0, false
	}
	return p.Wait + time.Duration(gpus)*p.WaitPerGPU + time.Duration(p.Relative*float64(smallWaited)) + time.Duration(p.Backlog*float64(backlog)), true
}

// Due reports whether a job of gpus GPUs that has waited waited is due a
// reservation (smallWaited as in DueAfter).
func (p Policy) Due(gpus int, waited, smallWaited time.Duration) bool {
	return p.DueBacklog(gpus, waited, smallWaited, 0)
}

// DueBacklog is Due for a job whose backlog wait is backlog.
func (p Policy) DueBacklog(gpus int, waited, smallWaited, backlog time.Duration) bool {
	d, ok := p.DueAfterBacklog(gpus, smallWaited, backlog)
	return ok && waited >= d
}

// Overdue is how long a job has waited past its due wait (DueAfterBacklog);
// ok is false when it is not due.
func (p Policy) Overdue(gpus int, waited, smallWaited, backlog time.Duration) (time.Duration, bool) {
	d, ok := p.DueAfterBacklog(gpus, smallWaited, backlog)
	if !ok || waited < d {
		return 0, false
	}
	return waited - d, true
}

// Work is a job ahead of another: its GPUs and how long it still runs by
// its declared run time (the whole of it for a job not started).
type Work struct {
	GPUs      int
	Remaining Runtime
}

// BacklogWait is how long the work ahead keeps capacity GPUs busy: the sum
// of its GPU-time over capacity, a job that declared no run time counted
// with Undeclared (DefaultUndeclared when 0), one past its estimate not at
// all. It is about the wait arrival order gives a job that arrives behind
// that work.
func (p Policy) BacklogWait(ahead []Work, capacity int) time.Duration {
	if capacity <= 0 {
		return 0
	}
	und := p.Undeclared
	if und <= 0 {
		und = DefaultUndeclared
	}
	var gpuTime float64
	for _, w := range ahead {
		d := und
		if w.Remaining.Known {
			d = max(w.Remaining.Duration, 0)
		}
		gpuTime += float64(w.GPUs) * float64(d)
	}
	return time.Duration(gpuTime / float64(capacity))
}

// Waiting is a job that has not started.
type Waiting struct {
	GPUs   int
	Waited time.Duration
	// Runtime is the run time it declared.
	Runtime Runtime
}

// Priority is w's response ratio, (waited + run time) / run time, with the
// run time it declared (Undeclared when none; at least a minute): with
// ShortFirst, waiting jobs are tried highest first. A short job passes
// long ones at once; a long one passes shorter ones as it waits, so none
// waits forever.
func (p Policy) Priority(w Waiting) float64 {
	rt := p.Undeclared
	if rt <= 0 {
		rt = DefaultUndeclared
	}
	if w.Runtime.Known {
		rt = w.Runtime.Duration
	}
	rt = max(rt, time.Minute)
	return float64(w.Waited+rt) / float64(rt)
}

// SmallWaited is the longest wait of a job of queue smaller than MinGPUs.
func (p Policy) SmallWaited(queue []Waiting) time.Duration {
	var out time.Duration
	for _, w := range queue {
		if w.GPUs < p.MinGPUs {
			out = max(out, w.Waited)
		}
	}
	return out
}

// Slots is how many jobs hold reservations at once.
func (p Policy) Slots() int { return max(p.Max, 1) }

// Heads returns the indices of the jobs reservations are for: the first
// Slots() due jobs of queue, in queue order (queue holds every waiting job,
// for SmallWaited).
func (p Policy) Heads(queue []Waiting) []int {
	var out []int
	small := p.SmallWaited(queue)
	for i, w := range queue {
		if len(out) == p.Slots() {
			break
		}
		if p.Due(w.GPUs, w.Waited, small) {
			out = append(out, i)
		}
	}
	return out
}

// Occupant is a running pod on a node.
type Occupant struct {
	GPUs int
	// Age is how long it has run.
	Age time.Duration
	// Preemptible pods started inside a reservation; they do not count as
	// GPUs still to drain.
	Preemptible bool
	// Backfilled pods started inside a reservation by their estimate
	// (Admit); they count as work that drains until they run past their
	// estimate, then they are victims.
	Backfilled bool
	// Remaining is how long the pod still runs by its declared run time
	// (0 or less once past it); unknown when it declared none.
	Remaining Runtime
}

// Node is a node as a reservation sees it.
type Node struct {
	Name string
	// GPUs is the node's capacity.
	GPUs      int
	Occupants []Occupant
	// Held: the node was held for the same job in the last decision, so
	// it keeps being held on a tie.
	Held bool
}

// draining is the GPUs of n that must still finish before the job can
// have the node, and the age of its longest-running such pod.
func (n Node) draining() (gpus int, oldest time.Duration) {
	for _, o := range n.Occupants {
		if o.Preemptible {
			continue
		}
		gpus += o.GPUs
		oldest = max(oldest, o.Age)
	}
	return gpus, oldest
}

// Rank orders the nodes by how soon they should hold a waiting job: with
// Estimates, those whose work ends first by its estimates (nodes with work
// of unknown run time last); then the fewest GPUs still to drain (with ByAge, first the youngest
// longest-running pod); ties go to a node held before, then by p.Order,
// then by name. It returns node indices, best first.
func (p Policy) Rank(nodes []Node) []int {
	type candidate struct {
		i      int
		drain  int
		oldest time.Duration
		in     time.Duration
		known  bool
	}
	cs := make([]candidate, len(nodes))
	for i, n := range nodes {
		d, o := n.draining()
		in, known := n.drainsIn()
		cs[i] = candidate{i, d, o, in, known}
	}
	sort.SliceStable(cs, func(a, b int) bool {
		x, y := cs[a], cs[b]
		if p.Estimates && x.known != y.known {
			return x.known
		}
		if p.Estimates && x.known && x.in != y.in {
			return x.in < y.in
		}
		if p.ByAge && x.oldest != y.oldest {
			return x.oldest < y.oldest
		}
		if x.drain != y.drain {
			return x.drain < y.drain
		}
		if hx, hy := nodes[x.i].Held, nodes[y.i].Held; hx != hy {
			return hx
		}
		switch p.Order {
		case "", OrderYoungest:
			if x.oldest != y.oldest {
				return x.oldest < y.oldest
			}
		case OrderOldest:
			if x.oldest != y.oldest {
				return x.oldest > y.oldest
			}
		}
		return nodes[x.i].Name < nodes[y.i].Name
	})
	out := make([]int, len(cs))
	for k, c := range cs {
		out[k] = c.i
	}
	return out
}

// Pick returns the indices of the nodes to hold for a job whose pods need
// pods GPUs each (one node per pod, as whole-node gang pods need): for each
// pod, largest first, the first node in Rank's order of enough capacity.
// Nodes with taken set are skipped (held for another job). It returns nil
// when the nodes cannot hold the pods.
func (p Policy) Pick(nodes []Node, pods []int, taken map[int]bool) []int {
	ranked := p.Rank(nodes)
	sizes := append([]int(nil), pods...)
	sort.Sort(sort.Reverse(sort.IntSlice(sizes)))
	used := make([]bool, len(ranked))
	var out []int
	for _, g := range sizes {
		found := false
		for k, i := range ranked {
			if used[k] || taken[i] || nodes[i].GPUs < g {
				continue
			}
			used[k], found = true, true
			out = append(out, i)
			break
		}
		if !found {
			return nil
		}
	}
	sort.Ints(out)
	return out
}

// MayStartInside reports whether a job other than the reservation's may
// start on a held node's free GPUs; if so it starts preemptible.
func (p Policy) MayStartInside() bool { return p.Preemptible }

// Victims returns, of the occupants of the held nodes, those to evict so
// that the job can start: every preemptible occupant, and every occupant
// backfilled by its estimate that has run past it, once nothing else is
// left to drain on the held nodes. ok is false while some other pod still
// runs there (the job must wait; a backfilled pod within its estimate ends
// before the reservation's start it was admitted for). Indices are [node
// in held][occupant].
func Victims(held []Node) (victims [][2]int, ok bool) {
	for i, n := range held {
		for k, o := range n.Occupants {
			if o.victim() {
				victims = append(victims, [2]int{i, k})
			} else {
				return nil, false
			}
		}
	}
	return victims, true
}

// victim reports whether o is evicted when the reservation can start.
func (o Occupant) victim() bool {
	return o.Preemptible || o.Backfilled && o.Remaining.Known && o.Remaining.Duration <= 0
}
