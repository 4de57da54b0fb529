package jobs

import (
	"cmp"
	"errors"
	"slices"
	"strconv"
	"time"

	"github.com/tessera-gpu/tessera/allocator/gang"
	"github.com/tessera-gpu/tessera/allocator/reserve"
)

// StrategyReserve is gang scheduling with backfill and reservations
// (allocator/reserve, Config.Reserve): once a big job has waited its due
// time (reserve.Policy.Due), the nodes with the fewest GPUs still to drain
// are held for it, up to Policy.Max jobs at once in queue order; others
// backfill outside them, and inside them only when the policy makes such
// backfill preemptible (evicted when the reservation fills).
const StrategyReserve Strategy = "reserve"

// BigGangGPUs is the size from which a job counts as a big gang in
// Result.MaxBigGangJCTHours (two 8-GPU nodes).
const BigGangGPUs = 16

// DefaultReservePolicy is the reservation policy of StrategyReserve, chosen
// on the ITP traces (docs/gang-quota.md, "Reservation and backfill"): a job
// of 16 GPUs or more is due once it has waited 48 h plus half the wait of
// the longest-waiting smaller job, and only while big jobs run on at most
// half the GPUs; one reservation at a time, on the nodes that drain first
// by the declared run times; a job that ends before the reservation starts
// backfills on its GPUs, others may start there preemptible; waiting jobs
// are tried by response ratio (a job that declares nothing counts as 24 h).
func DefaultReservePolicy() reserve.Policy {
	return reserve.Policy{MinGPUs: BigGangGPUs, Wait: 48 * time.Hour, Relative: 0.5, Preemptible: true, Order: reserve.OrderYoungest, Max: 1,
		Estimates: true, ShortFirst: true, Undeclared: 24 * time.Hour, MaxShare: 0.5}
}

// reservation is StrategyReserve's state.
type reservation struct {
	policy reserve.Policy
	// holds are the current reservations, in queue order of their jobs;
	// heldBy maps each held node to its job, outside lists the others.
	holds   []*jobState
	heldBy  map[int]*jobState
	outside []gang.Node
	// inside are the running jobs started on held nodes (preemptible or
	// backfilled by estimate), with the job whose nodes they used.
	inside map[*jobState]insideOf
	// window is when each reservation starts by the running work's
	// estimates (reserve.Start), as of the last hold.
	window map[*jobState]reserve.Window
}

// insideOf is how a job came to run on held nodes.
type insideOf struct {
	by  *jobState
	how reserve.Admission
}

// occupant is running job j's pod k as the reservation policy sees it.
func (s *sim) occupant(j *jobState, k int) reserve.Occupant {
	in := s.rsv.inside[j]
	// An elastic gang's pod beyond its minimum is taken back first.
	o := reserve.Occupant{GPUs: j.sizes[k], Age: time.Duration(s.now-j.start) * time.Second,
		Preemptible: in.how == reserve.AsPreemptible || k >= j.min, Backfilled: in.how == reserve.Backfilled}
	if s.rsv.policy.Estimates && j.rt.Known {
		o.Remaining = reserve.Expect(j.rt.Duration - time.Duration(s.now-j.start)*time.Second)
	}
	return o
}

func (s *sim) initReserve() {
	if s.cfg.Strategy == StrategyReserve {
		s.rsv = &reservation{policy: s.cfg.Reserve, heldBy: map[int]*jobState{}, inside: map[*jobState]insideOf{}, window: map[*jobState]reserve.Window{}}
		if s.cfg.ConsolidateMovesPerMinute > 0 {
			s.cons = &consolidation{}
		}
	}
}

// reserveArrive records j's backlog wait: the running and waiting work
// ahead of it, by the declared run times, over the cluster's GPUs.
func (s *sim) reserveArrive(j *jobState) {
	if s.rsv == nil || s.rsv.policy.Backlog <= 0 {
		return
	}
	ahead := make([]reserve.Work, 0, len(s.running)+len(s.queue))
	for _, c := range s.running {
		rt := c.job.rt
		if rt.Known {
			rt = reserve.Expect(rt.Duration - time.Duration(s.now-c.job.start)*time.Second)
		}
		ahead = append(ahead, reserve.Work{GPUs: c.job.job.GPUs, Remaining: rt})
	}
	for _, q := range s.queue {
		ahead = append(ahead, reserve.Work{GPUs: q.job.GPUs, Remaining: q.rt})
	}
	j.backlog = s.rsv.policy.BacklogWait(ahead, s.cfg.Nodes*s.cfg.GPUsPerNode)
}

// reserveFinish forgets a finished job.
func (s *sim) reserveFinish(j *jobState) {
	if s.rsv != nil {
		delete(s.rsv.inside, j)
	}
}

// scheduleReserve starts whole jobs in queue order under the reservations.
func (s *sim) scheduleReserve() error {
	for {
		evicted, err := s.reservePass()
		if err != nil {
			return err
		}
		if !evicted {
			break
		}
	}
	// Elastic gangs grow into what is left, off the held nodes.
	return s.growElastic(s.rsv.outside, func(*jobState, int) bool { return true })
}

// reservePass is one walk of the queue; it reports whether it evicted
// preemptible jobs (which then wait again).
func (s *sim) reservePass() (bool, error) {
	r := s.rsv
	s.noRoom = map[string]bool{}
	s.hold()
	var small time.Duration
	for _, j := range s.queue {
		if j.job.GPUs < r.policy.MinGPUs {
			small = time.Duration(s.now-j.job.Submit) * time.Second // the queue is in arrival order
			break
		}
	}
	walk := s.queue
	if r.policy.ShortFirst {
		walk = s.byPriority()
	}
	// With OverdueFirst, the free slots go to the most overdue due jobs.
	var next map[*jobState]bool
	if r.policy.OverdueFirst && len(r.holds) < r.policy.Slots() {
		type due struct {
			j    *jobState
			over time.Duration
		}
		var ds []due
		for _, j := range s.queue {
			if over, ok := r.policy.Overdue(j.job.GPUs, time.Duration(s.now-j.job.Submit)*time.Second, small, j.backlog); ok && !r.holding(j) {
				ds = append(ds, due{j, over})
			}
		}
		slices.SortStableFunc(ds, func(a, b due) int { return cmp.Compare(b.over, a.over) })
		next = map[*jobState]bool{}
		for _, d := range ds[:min(len(ds), r.policy.Slots()-len(r.holds))] {
			next[d.j] = true
		}
	}
	var kept []*jobState
	for _, j := range walk {
		started, err := s.reserveTry(j)
		if err != nil {
			return false, err
		}
		if started {
			continue
		}
		kept = append(kept, j)
		if len(r.holds) < r.policy.Slots() && !r.holding(j) && (next == nil || next[j]) && r.policy.MayHold(s.bigGPUs(), s.cfg.Nodes*s.cfg.GPUsPerNode) && r.policy.DueBacklog(j.job.GPUs, time.Duration(s.now-j.job.Submit)*time.Second, small, j.backlog) {
			r.holds = append(r.holds, j)
			s.hold()
			if s.cons != nil {
				// Consolidation need not wait for the next event.
				started, err := s.reserveTry(j)
				if err != nil {
					return false, err
				}
				if started {
					kept = kept[:len(kept)-1]
				}
			}
		}
	}
	if r.policy.ShortFirst {
		slices.SortFunc(kept, func(a, b *jobState) int { return a.order - b.order })
	}
	s.queue = kept
	evicted := len(s.evicted) > 0
	s.requeueEvicted()
	s.idleGPUs = 0
	for i := range r.heldBy {
		s.idleGPUs += s.nodes[i].Node.FullyFreeGPUs()
	}
	return evicted, nil
}

// byPriority is the queue by the policy's Priority, highest first, then
// in arrival order.
func (s *sim) byPriority() []*jobState {
	type entry struct {
		j   *jobState
		pri float64
	}
	es := make([]entry, len(s.queue))
	for i, j := range s.queue {
		es[i] = entry{j, s.rsv.policy.Priority(reserve.Waiting{GPUs: j.job.GPUs, Waited: time.Duration(s.now-j.job.Submit) * time.Second, Runtime: j.rt})}
	}
	slices.SortFunc(es, func(a, b entry) int {
		if c := cmp.Compare(b.pri, a.pri); c != 0 {
			return c
		}
		return a.j.order - b.j.order
	})
	out := make([]*jobState, len(es))
	for i, e := range es {
		out[i] = e.j
	}
	return out
}

// bigGPUs is the GPUs running jobs of the policy's MinGPUs or more use.
func (s *sim) bigGPUs() int {
	n := 0
	for _, c := range s.running {
		if c.job.job.GPUs >= s.rsv.policy.MinGPUs {
			n += c.job.job.GPUs
		}
	}
	return n
}

func (r *reservation) holding(j *jobState) bool {
	for _, h := range r.holds {
		if h == j {
			return true
		}
	}
	return false
}

// hold recomputes the nodes held for each reservation, in order, each on
// nodes the earlier ones left.
func (s *sim) hold() {
	r := s.rsv
	nodes := make([]reserve.Node, len(s.nodes))
	for i, n := range s.nodes {
		nodes[i] = reserve.Node{Name: n.Node.Name, GPUs: len(n.Node.GPUs)}
	}
	for _, c := range s.running {
		j := c.job
		for k, n := range j.nodes {
			if n >= 0 {
				nodes[n].Occupants = append(nodes[n].Occupants, s.occupant(j, k))
			}
		}
	}
	old := r.heldBy
	r.heldBy = map[int]*jobState{}
	r.window = map[*jobState]reserve.Window{}
	taken := map[int]bool{}
	for _, h := range r.holds {
		for i := range nodes {
			nodes[i].Held = old[i] == h
		}
		var held []reserve.Node
		for _, i := range r.policy.Pick(nodes, h.sizes[:h.min], taken) {
			r.heldBy[i], taken[i] = h, true
			held = append(held, nodes[i])
		}
		if held != nil {
			r.window[h] = reserve.Start(held)
		}
	}
	r.outside = r.outside[:0]
	for i, n := range s.nodes {
		if r.heldBy[i] == nil {
			r.outside = append(r.outside, n)
		}
	}
}

// started ends j's reservation.
func (s *sim) reserveStarted(j *jobState) {
	r := s.rsv
	for k, h := range r.holds {
		if h == j {
			r.holds = append(r.holds[:k], r.holds[k+1:]...)
			for i, b := range r.heldBy {
				if b == j {
					delete(r.heldBy, i)
				}
			}
			for in, b := range r.inside {
				if b.by == j {
					delete(r.inside, in)
				}
			}
			s.hold()
			s.noRoom = map[string]bool{} // the held nodes it did not use are free to others
			return
		}
	}
}

// reserveTry starts j if it can: a reservation's job outside the other
// reservations (evicting preemptible backfill on its held nodes once
// nothing else drains there), other jobs outside the held nodes, or inside
// them when preemptible.
func (s *sim) reserveTry(j *jobState) (bool, error) {
	r := s.rsv
	if len(r.holds) == 0 {
		return s.startOn(j, s.nodes, j.shapeKey(false), false)
	}
	if r.holding(j) {
		var cands []gang.Node
		for i, n := range s.nodes {
			if b := r.heldBy[i]; b == nil || b == j {
				cands = append(cands, n)
			}
		}
		ok, err := s.startOn(j, cands, "", false)
		if ok {
			s.reserveStarted(j)
		}
		if ok || err != nil {
			return ok, err
		}
		if r.policy.Preemptible || r.policy.Estimates {
			if ok, err := s.startEvicting(j); ok || err != nil {
				return ok, err
			}
		}
		return s.consolidateFor(j)
	}
	ok, err := s.startOn(j, r.outside, j.shapeKey(false), false)
	if ok || err != nil {
		return ok, err
	}
	// EASY backfill: the held nodes of the reservations j ends before,
	// by its estimate.
	if r.policy.Estimates && j.rt.Known {
		key := j.shapeKey(false) + " backfill"
		var admitted []*jobState
		for k, h := range r.holds {
			if r.policy.Admit(j.rt, r.window[h]) == reserve.Backfilled {
				key += " " + strconv.Itoa(k)
				admitted = append(admitted, h)
			}
		}
		if len(admitted) > 0 && !s.noRoom[key] {
			cands := append([]gang.Node(nil), r.outside...)
			for _, h := range admitted {
				for i, b := range r.heldBy {
					if b == h {
						cands = append(cands, s.nodes[i])
					}
				}
			}
			if ok, err := s.startOn(j, cands, key, true); ok || err != nil {
				return ok, err
			}
		}
	}
	if !r.policy.MayStartInside() {
		return false, nil
	}
	return s.startOn(j, s.nodes, j.shapeKey(false)+"inside", true)
}

// startEvicting starts a reservation's job on its held nodes once only
// preemptible backfill runs there, evicting it.
func (s *sim) startEvicting(j *jobState) (bool, error) {
	r := s.rsv
	var held []int
	var nodes []reserve.Node
	var owners [][]victim
	pos := map[int]int{}
	for i := range s.nodes {
		if r.heldBy[i] != j {
			continue
		}
		pos[i] = len(held)
		held = append(held, i)
		nodes = append(nodes, reserve.Node{Name: s.nodes[i].Node.Name, GPUs: len(s.nodes[i].Node.GPUs)})
		owners = append(owners, nil)
	}
	for _, c := range s.running {
		for k, n := range c.job.nodes {
			if p, ok := pos[n]; ok && n >= 0 {
				nodes[p].Occupants = append(nodes[p].Occupants, s.occupant(c.job, k))
				owners[p] = append(owners[p], victim{c.job, k})
			}
		}
	}
	victims, ok := reserve.Victims(nodes)
	if !ok || len(victims) == 0 {
		return false, nil
	}
	// An extra pod of an elastic gang is taken back; other occupants are
	// preemptible backfill, evicted whole.
	var taken []victim
	for _, v := range victims {
		o := owners[v[0]][v[1]]
		if o.k < o.j.min {
			o.k = -1
			delete(r.inside, o.j)
		}
		taken = append(taken, o)
	}
	s.takeBack(taken)
	cands := make([]gang.Node, 0, len(held))
	for _, i := range held {
		cands = append(cands, s.nodes[i])
	}
	ok, err := s.startOn(j, cands, "", false)
	if ok {
		s.reserveStarted(j)
	}
	return ok, err
}

// startOn plans j on nodes and starts it; key memoises shapes that found no
// room in this pass ("" for none). inside marks j as started on held nodes
// when it landed on one.
func (s *sim) startOn(j *jobState, nodes []gang.Node, key string, inside bool) (bool, error) {
	if key != "" && s.noRoom[key] {
		return false, nil
	}
	plan, err := gang.PlanGroup(s.group(j), nodes, s.policy)
	if errors.Is(err, gang.ErrNoRoom) {
		if key != "" {
			s.noRoom[key] = true
		}
		return false, nil
	}
	if err != nil {
		return false, err
	}
	s.apply(j, plan)
	if inside {
		r := s.rsv
		for _, n := range j.nodes {
			if b := r.heldBy[n]; b != nil {
				r.inside[j] = insideOf{by: b, how: r.policy.Admit(j.rt, r.window[b])}
				break
			}
		}
	}
	s.startJob(j)
	return true, nil
}
