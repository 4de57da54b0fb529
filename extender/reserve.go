package extender

import (
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/allocator/gang"
	"github.com/tessera-gpu/tessera/allocator/reserve"
	"github.com/tessera-gpu/tessera/api"
)

// A reservation keeps a starving workload's room from being taken by the
// work behind it. When a whole-GPU workload of the planner (a gang, or a
// queued pod) has waited longer than ReserveAfter and fits nowhere, the
// planner picks the nodes that will hold it soonest (allocator/reserve's
// order: the fewest GPUs in use, the nodes it held before on a tie) and
// counts the workload there in the
// ledger as if planned, though its members stay gated: what frees on those
// nodes is no one else's, neither the planner's nor kube-scheduler's (the
// filter sees the nodes full). Other work backfills everywhere else. One
// workload holds a reservation at a time; the reservation is made again on
// each pass (so it follows the cluster) until the workload fits and is
// planned, goes away, or the reservation has lasted ReserveFor: then it is
// released and that workload does not reserve again for as long, so a
// workload that cannot be served does not hold nodes forever. It lives in
// the ledger only: after a restart the next pass makes it again.

// reservation is the room a workload holds.
type reservation struct {
	uids  []types.UID
	nodes []string
	// since is when the workload first reserved (kept while it is made
	// again pass after pass).
	since time.Time
}

// ReservationConfig configures reservations; ReserveAfter 0 turns them off.
type ReservationConfig struct {
	// ReserveAfter is how long a workload waits before it reserves.
	ReserveAfter time.Duration
	// ReserveFor is how long a reservation lasts at most (default 1h).
	ReserveFor time.Duration
}

// releaseReservation drops the room workload key holds, so that its own
// plan may use it; the pass snapshot sees the release.
func (p *GangPlanner) releaseReservation(key string) (time.Time, bool) {
	r, ok := p.reserved[key]
	if !ok {
		return time.Time{}, false
	}
	delete(p.reserved, key)
	p.reservations.Store(int64(len(p.reserved)))
	p.cache.ReleaseGang(r.uids)
	p.refresh(r.nodes)
	return r.since, true
}

// refresh puts the ledger's current state of nodes into the pass snapshot.
func (p *GangPlanner) refresh(nodes []string) {
	if p.passSnap == nil {
		return
	}
	for _, n := range nodes {
		if st, ok := p.cache.Node(n); ok {
			p.passSnap[n] = st
		}
	}
}

// reserve makes a reservation for the workload key (members with
// demands) when it is due; it returns what to add to the waiting reason
// ("" when none is made). since is when the workload first reserved (zero
// for a first reservation).
func (p *GangPlanner) reserve(key string, g *api.Gang, members []*corev1.Pod, demands []Demand, minMember int, since time.Time) string {
	cfg := p.reservation
	if cfg.ReserveAfter <= 0 || len(p.reserved) > 0 {
		return ""
	}
	now := p.now()
	if until, cooling := p.cooldown[key]; cooling {
		if now.Before(until) {
			return ""
		}
		delete(p.cooldown, key)
	}
	oldest := members[0].CreationTimestamp.Time
	for _, m := range members {
		if m.CreationTimestamp.Time.Before(oldest) {
			oldest = m.CreationTimestamp.Time
		}
	}
	if now.Sub(oldest) < cfg.ReserveAfter {
		return ""
	}
	for _, d := range demands {
		if d.WholeGPUs == 0 {
			return "" // slices are small; they do not starve behind others
		}
	}
	hold := cfg.ReserveFor
	if hold <= 0 {
		hold = time.Hour
	}
	if since.IsZero() {
		since = now
	}
	if now.Sub(since) >= hold {
		p.cooldown[key] = now.Add(hold)
		return fmt.Sprintf("its reservation lasted %s and was released; it does not reserve again before %s", hold, now.Add(hold).UTC().Format(time.RFC3339))
	}
	snap := p.passSnap
	if snap == nil {
		snap = p.cache.Snapshot()
	}
	res, ok := p.soonest(snap, g, members, demands, minMember, p.heldBefore[key])
	if !ok {
		return ""
	}
	uses := make([]*PodUse, len(members))
	r := &reservation{since: since}
	seen := map[string]bool{}
	for i, pl := range res.Placements {
		uses[i] = PlannedPodUse(members[i], &api.GangPlan{Gang: g.Name, Node: pl.Node})
		r.uids = append(r.uids, members[i].UID)
		if !seen[pl.Node] {
			seen[pl.Node] = true
			r.nodes = append(r.nodes, pl.Node)
		}
	}
	if err := p.cache.ReserveGang(snap, uses); err != nil {
		return "" // a node changed meanwhile: the next pass reserves
	}
	p.reserved[key] = r
	p.heldBefore[key] = map[string]bool{}
	for _, n := range r.nodes {
		p.heldBefore[key][n] = true
	}
	p.reservations.Store(int64(len(p.reserved)))
	p.refresh(r.nodes)
	sort.Strings(r.nodes)
	msg := fmt.Sprintf("it waited longer than %s: nodes %s are reserved for it (nothing else starts on them) until it fits there, at most until %s",
		cfg.ReserveAfter, strings.Join(r.nodes, ", "), since.Add(hold).UTC().Format(time.RFC3339))
	for _, m := range p.untold(key+" reserved", msg, members) {
		p.events.Eventf(m, corev1.EventTypeNormal, api.EventReserved, "tessera: %s", msg)
	}
	return msg
}

// soonest plans the workload on the fewest nodes that will hold it
// soonest, as if they were empty: in allocator/reserve's order (the fewest
// GPUs still in use first, the nodes held before on a tie, then by name);
// the smallest such prefix that holds it (found by bisection: a longer
// prefix holds whatever a shorter one does). held are the nodes the
// workload held before.
func (p *GangPlanner) soonest(snap map[string]*NodeState, g *api.Gang, members []*corev1.Pod, demands []Demand, minMember int, held map[string]bool) (*gang.Plan, bool) {
	var candidates []*NodeState
	for _, st := range snap {
		if st.Info.HasInventory && st.Info.Err == nil {
			candidates = append(candidates, st)
		}
	}
	view := make([]reserve.Node, len(candidates))
	for i, st := range candidates {
		view[i] = reserve.Node{Name: st.Info.Name, GPUs: len(st.Info.GPUs), Held: held[st.Info.Name],
			Occupants: []reserve.Occupant{{GPUs: len(st.Info.GPUs) - st.FreeGPUs()}}}
	}
	nodes := make([]*NodeState, len(candidates))
	for k, i := range (reserve.Policy{}).Rank(view) {
		nodes[k] = candidates[i]
	}
	empty := func(k int) map[string]*NodeState {
		out := make(map[string]*NodeState, k)
		for _, st := range nodes[:k] {
			out[st.Info.Name] = BuildNodeState(st.Info, nil)
		}
		return out
	}
	try := func(k int) (*gang.Plan, bool) {
		grp, in := p.gangInput(empty(k), g, members, demands, minMember, false)
		res, err := gang.PlanGroup(grp, in, p.policy)
		return res, err == nil
	}
	if _, ok := try(len(nodes)); !ok {
		return nil, false // it would not fit an empty cluster
	}
	lo, hi := 1, len(nodes)
	for lo < hi {
		mid := (lo + hi) / 2
		if _, ok := try(mid); ok {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return try(lo)
}
