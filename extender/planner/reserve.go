package planner

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/allocator/gang"
	"github.com/tessera-gpu/tessera/allocator/reserve"
	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/gpureq"
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
// workload that cannot be served does not hold nodes forever. The room
// lives in the ledger only: after a restart the next pass makes it again,
// on the nodes held before, counting ReserveFor (and a cooldown) from
// before the restart, as the planner's ReservationStore recorded them
// (reserve_store.go).

//
// Backfill inside a reservation (allocator/reserve's Admit, the same rule
// as the simulator's strategy reserve): a workload the planner plans (a
// gang, or a queued pod) that fits nowhere else may be planned on a
// reservation's nodes when every member declares api.AnnotationExpectedRuntime
// and, by the longest of them, it ends before the reservation starts
// (ReservationConfig.Backfill; the start is when the pods on the held
// nodes end by their own hints, unknown when one declared none), or when
// every member is marked api.AnnotationPreemptible
// (ReservationConfig.Preemptible). The reservation's workload evicts, once
// nothing else is left to drain on its nodes, the pods marked preemptible
// there and the pods that started there after it reserved and have run
// past their expected run time (allocator/reserve's Victims): an estimate
// that is too short hurts only the pod that declared it.

// reservation is the room a workload holds.
type reservation struct {
	uids  []types.UID
	nodes []string
	// uses are what the ledger counts for it (its members planned on
	// nodes), to count them again after a backfill planned beside them.
	uses []*Use
	// since is when the workload first reserved (kept while it is made
	// again pass after pass).
	since time.Time
	// window is when it starts by the run-time hints of the pods on its
	// nodes, as of at.
	window reserve.Window
	at     time.Time
}

// ReservationConfig configures reservations; ReserveAfter 0 turns them off.
type ReservationConfig struct {
	// ReserveAfter is how long a workload waits before it reserves.
	ReserveAfter time.Duration
	// ReserveFor is how long a reservation lasts at most (default 1h).
	ReserveFor time.Duration
	// Backfill ranks the nodes to hold by when their pods end by their
	// expected run times, and lets a workload that ends before the
	// reservation starts (by its members' api.AnnotationExpectedRuntime)
	// be planned on the reservation's nodes.
	Backfill bool
	// MinGPUs, WaitPerGPU and Relative complete the simulator's rule of
	// who is due a reservation (allocator/reserve's Policy.Due, with
	// ReserveAfter its Wait): a workload of fewer than MinGPUs whole GPUs
	// (0: 1) never reserves; one of more is due once it has waited
	// ReserveAfter + WaitPerGPU x its GPUs + Relative x the wait of the
	// longest-waiting pending GPU pod smaller than MinGPUs.
	MinGPUs    int
	WaitPerGPU time.Duration
	Relative   float64
	// Preemptible lets a workload whose members are all marked
	// api.AnnotationPreemptible be planned on a reservation's nodes; it is
	// evicted when the reservation fills.
	Preemptible bool
	// PastBudgets, when set, deletes a pod on a reservation's nodes that
	// the Eviction API keeps there by its PodDisruptionBudget: the pod is
	// there by its own promise (marked preemptible, or an expected run
	// time it has run past), and a budget its tenant wrote does not take
	// the promise back (a tenant's 8 preemptible pods under a budget of
	// maxUnavailable 0 held a reserved gang off its nodes for good, the
	// evictions refused every 2 s, seen only in the extender's log).
	PastBudgets BudgetOverrider
}

// policy is the allocator/reserve policy of the configuration; marked says
// whether the workload asking is marked preemptible.
func (c ReservationConfig) policy(marked bool) reserve.Policy {
	return reserve.Policy{MinGPUs: 1, Estimates: c.Backfill, Preemptible: c.Preemptible && marked}
}

// due is the allocator/reserve policy that says who is due a reservation.
func (c ReservationConfig) due() reserve.Policy {
	return reserve.Policy{MinGPUs: max(c.MinGPUs, 1), Wait: c.ReserveAfter, WaitPerGPU: c.WaitPerGPU, Relative: c.Relative}
}

// smallWaited is how long the longest-waiting pending pod outside any gang
// that asks for fewer than minGPUs GPUs (whole GPUs, or a slice) has
// waited, among the pods of the pass.
func (p *GangPlanner) smallWaited(minGPUs int) time.Duration {
	if p.reservation.Relative == 0 {
		return 0
	}
	now := p.now()
	var out time.Duration
	for _, pod := range p.passPods {
		if pod.Spec.NodeName != "" || gpureq.Ended(pod) {
			continue
		}
		if _, gang, _ := api.GangOf(pod); gang {
			continue // a member of a workload: its size is the gang's
		}
		d, err := p.ledger.ParseDemand(pod)
		if err != nil || !d.UsesGPUs() || d.Whole() >= minGPUs {
			continue
		}
		out = max(out, now.Sub(pod.CreationTimestamp.Time))
	}
	return out
}

// hints reads the run-time hints of a workload's members: its run time is
// the longest member's, unknown when one declares none (or a malformed
// one); it is preemptible when every member is marked so.
func hints(members []*corev1.Pod) (rt reserve.Runtime, preemptible bool) {
	rt, preemptible = reserve.Runtime{Known: true}, true
	for _, m := range members {
		d, ok, err := api.GetExpectedRuntime(m.Annotations)
		if !ok || err != nil {
			rt.Known = false
		} else {
			rt.Duration = max(rt.Duration, d)
		}
		if pre, err := api.GetPreemptible(m.Annotations); !pre || err != nil {
			preemptible = false
		}
	}
	if !rt.Known {
		rt = reserve.Runtime{}
	}
	return rt, preemptible
}

// occupants are the pods of st as a reservation made at since sees them
// at now (holder's own planned members left out), with the pods they stand
// for. Nodes compared with each other must be seen at the same now: pods
// started in the same second (StartTime has seconds) then drain at the same
// time, and the tie goes to the node held before; a clock read per node
// made the later-read node drain a few microseconds sooner, and a
// reservation hopped between such nodes pass after pass.
func (p *GangPlanner) occupants(st Node, holder map[types.UID]bool, since, now time.Time) ([]reserve.Occupant, []*corev1.Pod) {
	var occ []reserve.Occupant
	var pods []*corev1.Pod
	gpusOf := st.Occupants()
	uids := make([]types.UID, 0, len(gpusOf))
	for uid := range gpusOf {
		uids = append(uids, uid)
	}
	sort.Slice(uids, func(a, b int) bool { return uids[a] < uids[b] })
	for _, uid := range uids {
		if holder[uid] {
			continue
		}
		gpus := gpusOf[uid]
		if gpus == 0 {
			continue // CPU only: it does not keep GPUs from the reservation
		}
		o := reserve.Occupant{GPUs: gpus}
		pod := p.passPods[uid]
		if pod != nil {
			// A pod not started yet (planned, binding) has its whole run
			// time ahead and starts after the reservation was made.
			started := now
			if pod.Status.StartTime != nil {
				started = pod.Status.StartTime.Time
			}
			o.Age = now.Sub(started)
			rt, marked := hints([]*corev1.Pod{pod})
			if rt.Known {
				o.Remaining = reserve.Expect(rt.Duration - o.Age)
				o.Backfilled = !started.Before(since)
			}
			o.Preemptible = marked && p.reservation.Preemptible
		}
		occ = append(occ, o)
		pods = append(pods, pod)
	}
	return occ, pods
}

// reservationTaken ends workload key's reservation once kept, its members
// planned now or held for by consolidation, are in the ledger (their uses
// took their reserved uses' place); a reserved member kept does not name
// is released.
func (p *GangPlanner) reservationTaken(key string, kept []*corev1.Pod) {
	r := p.reserved[key]
	if r == nil {
		return
	}
	delete(p.reserved, key)
	p.reservations.Store(int64(len(p.reserved)))
	p.releaseUIDsBut(r, kept)
}

// releaseUIDsBut drops from the ledger the uses of r's members that keep
// (pods planned or reserved again) does not name.
func (p *GangPlanner) releaseUIDsBut(r *reservation, keep []*corev1.Pod) {
	p.ledger.ReleaseGang(uidsBut(r.uids, podUIDs(keep)))
	p.refresh(r.nodes)
}

// uidsBut are the uids keep does not hold.
func uidsBut(uids []types.UID, keep map[types.UID]bool) []types.UID {
	var out []types.UID
	for _, uid := range uids {
		if !keep[uid] {
			out = append(out, uid)
		}
	}
	return out
}

// uidSet is uids as a set.
func uidSet(uids []types.UID) map[types.UID]bool {
	out := make(map[types.UID]bool, len(uids))
	for _, uid := range uids {
		out[uid] = true
	}
	return out
}

// podUIDs is the set of the UIDs of pods.
func podUIDs(pods []*corev1.Pod) map[types.UID]bool {
	out := make(map[types.UID]bool, len(pods))
	for _, pod := range pods {
		out[pod.UID] = true
	}
	return out
}

// releaseReservation drops the room workload key holds; the pass snapshot
// sees the release.
func (p *GangPlanner) releaseReservation(key string) (time.Time, bool) {
	r, ok := p.reserved[key]
	if !ok {
		return time.Time{}, false
	}
	delete(p.reserved, key)
	p.reservations.Store(int64(len(p.reserved)))
	p.ledger.ReleaseGang(r.uids)
	p.refresh(r.nodes)
	return r.since, true
}

// refreshUses is refresh of the nodes uses are on.
func (p *GangPlanner) refreshUses(uses []*Use) {
	nodes := make([]string, len(uses))
	for i, u := range uses {
		nodes[i] = u.Node
	}
	p.refresh(nodes)
}

// refresh puts the ledger's current state of nodes into the pass snapshot.
func (p *GangPlanner) refresh(nodes []string) {
	if p.passSnap == nil {
		return
	}
	for _, n := range nodes {
		if st, ok := p.ledger.Node(n); ok {
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
	old := p.reserved[key] // made again here, or released by plan
	if cfg.ReserveAfter <= 0 || len(p.reserved) > 0 && old == nil || p.holds[key] != nil {
		return "" // one at a time; a workload whose freed room is held has its room
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
	gpus := 0
	for _, d := range demands {
		if d.Whole() == 0 {
			return "" // slices are small; they do not starve behind others
		}
		gpus += d.Whole()
	}
	due := cfg.due()
	if !due.Due(gpus, now.Sub(oldest), p.smallWaited(due.MinGPUs)) {
		return ""
	}
	hold := cfg.ReserveFor
	if hold <= 0 {
		hold = time.Hour
	}
	if since.IsZero() {
		since = now
	}
	if now.Sub(since) >= hold {
		delete(p.store.restoredSince, key)
		p.cooldown[key] = now.Add(hold)
		return fmt.Sprintf("its reservation lasted %s and was released; it does not reserve again before %s", hold, now.Add(hold).UTC().Format(time.RFC3339))
	}
	snap := p.passSnap
	if snap == nil {
		snap = p.ledger.Snapshot()
	}
	// Its reservation of before, still in the ledger, is its own room.
	ownRoom := func(s Snapshot) Snapshot {
		if old == nil {
			return s
		}
		return without(s, uidSet(old.uids))
	}
	view := ownRoom(snap)
	res, ok := p.soonest(view, g, members, demands, minMember, p.heldBefore[key])
	if !ok {
		return ""
	}
	uses := make([]*Use, len(members))
	r := &reservation{since: since}
	seen := map[string]bool{}
	for i, pl := range res.Placements {
		uses[i] = p.ledger.Planned(members[i], &api.GangPlan{Gang: g.Name, Node: pl.Node})
		r.uids = append(r.uids, members[i].UID)
		if !seen[pl.Node] {
			seen[pl.Node] = true
			r.nodes = append(r.nodes, pl.Node)
		}
	}
	// Victims first: their GPUs are the reservation's as they leave.
	leaving, evict := p.fill(key, r, view)
	// The members' uses replace those of its reservation of before in one
	// step (ReserveGang), so that its room is never free meanwhile.
	err := p.ledger.ReserveGang(snap, p.held(view, uses, since, leaving))
	for try := 0; try < 3 && errors.Is(err, ErrStaleSnapshot); try++ {
		// A node changed since the pass began (a pod bound there, as
		// backfill may, or left): hold on the nodes as they are now, so
		// that the room is not free until the next pass.
		fresh := p.ledger.Snapshot()
		err = p.ledger.ReserveGang(fresh, p.held(ownRoom(fresh), uses, since, leaving))
	}
	if err != nil {
		return "" // the next pass reserves
	}
	evicting := evict()
	r.uses = uses
	p.reserved[key] = r
	if old != nil {
		p.releaseUIDsBut(old, members) // members it no longer counts
	}
	delete(p.store.restoredSince, key) // r carries it now
	p.heldBefore[key] = map[string]bool{}
	for _, n := range r.nodes {
		p.heldBefore[key][n] = true
	}
	p.reservations.Store(int64(len(p.reserved)))
	p.refresh(r.nodes)
	sort.Strings(r.nodes)
	msg := fmt.Sprintf("it waited longer than %s: nodes %s are reserved for it (nothing else starts on them) until it fits there, at most until %s",
		cfg.ReserveAfter, strings.Join(r.nodes, ", "), since.Add(hold).UTC().Format(time.RFC3339))
	if cfg.Backfill || cfg.Preemptible {
		msg = fmt.Sprintf("it waited longer than %s: nodes %s are reserved for it (only backfill that ends before it starts, or preemptible pods, start on them) until it fits there, at most until %s",
			cfg.ReserveAfter, strings.Join(r.nodes, ", "), since.Add(hold).UTC().Format(time.RFC3339))
	}
	if r.window.Known {
		msg += "; by the pods' expected run times it starts " + startsAt(r.window, r.at)
	}
	if evicting != "" {
		msg += "; " + evicting
	}
	for _, m := range p.untold(key, topicReserved, msg, members) {
		p.events.Eventf(m, corev1.EventTypeNormal, api.EventReserved, "tessera: %s", msg)
	}
	return msg
}

// startsAt says when a reservation whose window is w as of at starts by
// the expected run times of the pods on its nodes ("at <time>", or "now"):
// a time, not a count down, so that its Event is the same pass after pass
// (and told once) while those pods and their hints stay the same.
func startsAt(w reserve.Window, at time.Time) string {
	if w.In <= 0 {
		return "now"
	}
	return "at " + at.Add(w.In).UTC().Format(time.RFC3339)
}

// soonest plans the workload on the fewest nodes that will hold it
// soonest, as if they were empty: in allocator/reserve's order (the fewest
// GPUs still in use first, the nodes held before on a tie, then by name);
// the smallest such prefix that holds it (found by bisection: a longer
// prefix holds whatever a shorter one does). held are the nodes the
// workload held before.
func (p *GangPlanner) soonest(snap Snapshot, g *api.Gang, members []*corev1.Pod, demands []Demand, minMember int, held map[string]bool) (*gang.Plan, bool) {
	var candidates []Node
	freed := p.heldNodes() // another workload's, freed by consolidation
	for _, st := range snap {
		if st.Usable() && !freed[st.Name()] {
			candidates = append(candidates, st)
		}
	}
	view := make([]reserve.Node, len(candidates))
	now := p.now()
	for i, st := range candidates {
		view[i] = reserve.Node{Name: st.Name(), GPUs: st.GPUCount(), Held: held[st.Name()],
			Occupants: []reserve.Occupant{{GPUs: st.GPUCount() - st.FreeGPUs()}}}
		if p.reservation.Backfill {
			view[i].Occupants, _ = p.occupants(st, nil, now, now)
		}
	}
	nodes := make([]Node, len(candidates))
	for k, i := range p.reservation.policy(false).Rank(view) {
		nodes[k] = candidates[i]
	}
	empty := func(k int) Snapshot {
		out := make(Snapshot, k)
		for _, st := range nodes[:k] {
			out[st.Name()] = st.Empty()
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

// fill computes reservation r's window on the nodes of snap and, once only
// victims are left on its nodes (allocator/reserve's Victims), finds them:
// leaving are their pods, and evict evicts them and says so ("" for none).
// Call evict once the reservation holds their nodes, so that the GPUs they
// free go to no one else.
func (p *GangPlanner) fill(key string, r *reservation, snap Snapshot) (leaving map[types.UID]bool, evict func() string) {
	none := func() string { return "" }
	holder := map[types.UID]bool{}
	for _, uid := range r.uids {
		holder[uid] = true
	}
	var held []reserve.Node
	var owners [][]*corev1.Pod
	now := p.now()
	for _, n := range r.nodes {
		st, ok := snap[n]
		if !ok {
			continue
		}
		occ, pods := p.occupants(st, holder, r.since, now)
		held = append(held, reserve.Node{Name: n, GPUs: st.GPUCount(), Occupants: occ})
		owners = append(owners, pods)
	}
	r.window, r.at = reserve.Start(held), now
	if !p.reservation.Backfill && !p.reservation.Preemptible {
		return nil, none
	}
	victims, ok := reserve.Victims(held)
	if !ok || len(victims) == 0 {
		return nil, none
	}
	leaving = map[types.UID]bool{}
	var evictions []func() string
	for _, v := range victims {
		pod := owners[v[0]][v[1]]
		if pod == nil {
			continue
		}
		leaving[pod.UID] = true
		if pod.DeletionTimestamp != nil {
			continue // already leaving
		}
		why := "it is marked preemptible"
		node := held[v[0]].Name // the ledger's: a pod whose bind is in flight has no spec.nodeName yet
		if held[v[0]].Occupants[v[1]].Backfilled && !held[v[0]].Occupants[v[1]].Preemptible {
			why = "it was started there by its expected run time and has run past it"
		}
		evictions = append(evictions, func() string {
			past, err := p.evictForReservation(pod)
			if err != nil {
				klog.Background().Info("evicting for a reservation", "pod", klog.KObj(pod), "reservation", key, "err", err)
				p.events.Eventf(pod, corev1.EventTypeWarning, api.EventPreemptionBlocked, "tessera: node %s is reserved for %s, which can start there now (%s), but this pod could not be evicted: %v", node, key, why, err)
				return ""
			}
			if past {
				why += ", past its PodDisruptionBudget (the budget does not take that back)"
			}
			p.events.Eventf(pod, corev1.EventTypeWarning, api.EventPreempted, "tessera: evicted from node %s, reserved for %s, which can start there now: %s", node, key, why)
			return pod.Namespace + "/" + pod.Name
		})
	}
	return leaving, func() string {
		var names []string
		for _, e := range evictions {
			if n := e(); n != "" {
				names = append(names, n)
			}
		}
		if len(names) == 0 {
			return ""
		}
		return "evicting " + strings.Join(names, ", ") + " from its nodes"
	}
}

// backfill plans workload key on another workload's reservation when its
// run-time hints allow (Admit): the reservation is taken out of the
// ledger, the workload planned on what is free, and restore counts the
// reservation again (call it once the workload's plan is in the ledger).
// It returns nil when no reservation admits the workload or it does not
// fit there; msg says why it was admitted.
func (p *GangPlanner) backfill(key string, g *api.Gang, members []*corev1.Pod, demands []Demand, minMember int) (res *gang.Plan, snap Snapshot, restore func(), msg string) {
	cfg := p.reservation
	if !cfg.Backfill && !cfg.Preemptible {
		return nil, nil, nil, ""
	}
	rt, marked := hints(members)
	keys := make([]string, 0, len(p.reserved))
	for k := range p.reserved {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, holder := range keys {
		r := p.reserved[holder]
		if holder == key {
			continue
		}
		how := cfg.policy(marked).AdmitNew(rt, r.window)
		if how == reserve.Refused {
			continue
		}
		p.ledger.ReleaseGang(r.uids)
		p.refresh(r.nodes)
		snap := p.passSnap
		if snap == nil {
			snap = p.ledger.Snapshot()
		}
		grp, nodes := p.gangInput(snap, g, members, demands, minMember, false)
		plan, err := gang.PlanGroup(grp, nodes, p.policy)
		restore := func() {
			now := p.ledger.Snapshot()
			if err := p.ledger.ReserveGang(now, p.held(now, r.uses, r.since, nil)); err != nil {
				delete(p.reserved, holder) // the next pass reserves again
				p.reservations.Store(int64(len(p.reserved)))
			}
			p.refresh(r.nodes)
		}
		if err != nil {
			restore()
			continue
		}
		switch how {
		case reserve.Backfilled:
			msg = fmt.Sprintf("planned on room reserved for %s: by its expected run time (%s) it ends before that reservation starts (%s); if it runs past it when the reservation can start, it is evicted",
				holder, rt.Duration, startsAt(r.window, r.at))
		default:
			msg = fmt.Sprintf("planned on room reserved for %s as a preemptible workload: it is evicted when that reservation fills", holder)
		}
		return plan, snap, restore, msg
	}
	return nil, nil, nil, ""
}

// backfillEvent tells the members of a workload planned inside a
// reservation why.
func (p *GangPlanner) backfillEvent(key string, members []*corev1.Pod, msg string) {
	for _, m := range p.untold(key, topicBackfill, msg, members) {
		p.events.Eventf(m, corev1.EventTypeNormal, api.EventBackfilled, "tessera: %s", msg)
	}
}

// held is what a reservation's uses (its members' whole demands) hold in
// the ledger of snap. On a node where pods were let in (backfilled by their
// expected run time, or preemptible) and stay, or where pods are planned
// but not bound yet, only the whole GPUs free there, so that those pods can
// bind where they were planned (the bind waits for the node to offer the
// GPUs pending there; a hold beyond what is free left the node short of
// the planned pods' own GPUs, and their binds failed until the reservation
// moved); elsewhere, and once those pods are leaving (evicted), all of
// them, even beyond what is free, so that a GPU freed between two passes
// goes to no one else. (On a node so capped, a GPU freed between passes by
// another pod may be taken until the next pass holds it.)
func (p *GangPlanner) held(snap Snapshot, uses []*Use, since time.Time, leaving map[types.UID]bool) []*Use {
	letIn := p.reservation.Backfill || p.reservation.Preemptible
	holder := map[types.UID]bool{}
	for _, u := range uses {
		holder[u.UID] = true
	}
	free := map[string]int{}
	capped := map[string]bool{}
	now := p.now()
	for _, u := range uses {
		st, ok := snap[u.Node]
		if !ok {
			continue
		}
		if _, seen := free[u.Node]; seen {
			continue
		}
		free[u.Node] = st.FreeGPUs()
		occ, pods := p.occupants(st, holder, since, now)
		for k, o := range occ {
			pod := pods[k]
			if pod != nil && (leaving[pod.UID] || pod.DeletionTimestamp != nil) {
				continue
			}
			// A pod the pass did not list may be one planned since: it
			// counts as not bound.
			planned := pod == nil || pod.Spec.NodeName == ""
			if planned || letIn && (o.Backfilled || o.Preemptible) {
				capped[u.Node] = true
			}
		}
	}
	out := make([]*Use, len(uses))
	for i, u := range uses {
		c := *u
		if capped[u.Node] {
			c.WholePending = max(0, min(c.WholePending, free[u.Node]))
			free[u.Node] -= c.WholePending
		}
		out[i] = &c
	}
	return out
}

// evictForReservation evicts pod from a reservation's node; a pod its
// PodDisruptionBudget keeps (429) is deleted past it with
// ReservationConfig.PastBudgets, and past says so.
func (p *GangPlanner) evictForReservation(pod *corev1.Pod) (past bool, err error) {
	ctx := context.Background()
	err = p.client.Evict(ctx, pod)
	if over := p.reservation.PastBudgets; over != nil && apierrors.IsTooManyRequests(err) {
		return true, over.DeletePastBudget(ctx, pod)
	}
	return false, err
}
