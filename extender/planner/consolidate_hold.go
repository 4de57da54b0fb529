package planner

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/allocator/gang"
	"github.com/tessera-gpu/tessera/api"
)

// A freedHold is the room consolidation frees for a workload, held for it
// in the ledger from before the first eviction: its members are counted on
// the nodes of their plan there, beyond what is free while the moved pods
// leave, so the filter sees those nodes full. Without it the room was
// free from the moment the pods left until the workload's plan was
// reserved; when that reservation found the snapshot stale (the pods
// leaving change the very nodes), the pods' replacements, which their
// controller recreates at once, could bind there first, and a minute
// later consolidation moved them again.
//
// The hold lasts until the workload is planned (its plan takes the hold's
// place in the ledger at once, the same pods counted on the same nodes,
// so no moment leaves the room free), goes away, or holdFor has passed.
// Meanwhile its workload is planned on the nodes as if the moved pods and
// its own hold were gone, and nothing else is let in there: not the pods
// kube-scheduler places, not backfill, preemptible or not (Lifted lifts
// nothing on its nodes; the planner's backfill() uses reservations only),
// not another workload's reservation (soonest() passes its nodes over).
// Consolidation moves nothing more for a workload that holds one:
// consolidation never evicts twice for the same room.
//
// A hold is a cache, in memory and in the ledger only: a restart loses
// it, as it loses the consolidator's hints, and nothing else depends on
// it. Its loss costs a little work, never a wrong eviction: the moved
// pods are leaving (their deletion is in the API server, which the pass
// reads) or gone, the next pass plans the workload on their room when it
// is still free, the extender moves nothing in its first minute, and a
// move after that is a new decision, within the budget, on the cluster
// as the extender then sees it. The window is short anyway: the plan,
// written to the members' annotations (which the ledger counts after a
// restart), normally follows the evictions in the same pass.
type freedHold struct {
	// uids are the workload's members held; uses what the ledger counts
	// for them; nodes the nodes held.
	uids  []types.UID
	uses  []*Use
	nodes []string
	// gone are the pods moved and the members held: without them the
	// nodes are the room freed.
	gone  map[types.UID]bool
	until time.Time
}

// holdFor is how long a hold lasts at most: as long as the consolidator
// counts the pods it moved as leaving (hints).
const holdFor = 2 * time.Minute

// holdFreed holds, for workload key, the room the pods of gone free (see
// freedHold), on the ledger as it is now: the workload is planned there
// by plan (on the ledger's nodes without gone) and its members counted on
// their nodes, all or none. It returns the plan; false when the workload
// does not fit there now, or the ledger kept changing: the caller then
// moves nothing (the next pass decides again).
func (p *GangPlanner) holdFreed(ctx context.Context, key string, g *api.Gang, members []*corev1.Pod, gone map[types.UID]bool, plan func(Snapshot) (*gang.Plan, bool)) (*gang.Plan, bool) {
	logger := klog.FromContext(ctx)
	for try := 0; try < 3; try++ {
		now := p.ledger.Snapshot()
		res, ok := plan(without(now, gone))
		if !ok {
			logger.V(2).Info("No consolidation: the room it would free is taken meanwhile", "workload", key)
			return nil, false
		}
		h := p.newHold(g, members, res, gone)
		err := p.ledger.ReserveGang(now, h.uses)
		if errors.Is(err, ErrStaleSnapshot) {
			continue // a node changed meanwhile: plan on it as it is now
		}
		if err != nil {
			logger.Info("No consolidation: its room could not be held", "workload", key, "err", err)
			return nil, false
		}
		p.holds[key] = h
		p.reservationTaken(key, members) // the hold took its reservation's place
		p.refresh(h.nodes)
		logger.V(2).Info("Holding the room consolidation frees", "workload", key, "nodes", h.nodes, "until", h.until)
		return res, true
	}
	logger.V(2).Info("No consolidation: the nodes kept changing while its room was held", "workload", key)
	return nil, false
}

// newHold is the hold of members planned by res on the room the pods of
// gone free.
func (p *GangPlanner) newHold(g *api.Gang, members []*corev1.Pod, res *gang.Plan, gone map[types.UID]bool) *freedHold {
	h := &freedHold{gone: map[types.UID]bool{}, until: p.now().Add(holdFor)}
	for uid := range gone {
		h.gone[uid] = true
	}
	seen := map[string]bool{}
	for i, pl := range res.Placements {
		h.uses = append(h.uses, p.ledger.Planned(members[i], &api.GangPlan{Gang: g.Name, Node: pl.Node}))
		h.uids = append(h.uids, members[i].UID)
		h.gone[members[i].UID] = true
		if !seen[pl.Node] {
			seen[pl.Node] = true
			h.nodes = append(h.nodes, pl.Node)
		}
	}
	sort.Strings(h.nodes)
	return h
}

// liveHold is workload key's hold, nil when it has none; a hold past its
// time is released.
func (p *GangPlanner) liveHold(key string) *freedHold {
	h := p.holds[key]
	if h == nil {
		return nil
	}
	if !p.now().Before(h.until) {
		p.releaseHold(key)
		return nil
	}
	return h
}

// releaseHold drops workload key's hold from the ledger (the pass
// snapshot sees it).
func (p *GangPlanner) releaseHold(key string) {
	h := p.holds[key]
	if h == nil {
		return
	}
	delete(p.holds, key)
	p.ledger.ReleaseGang(h.uids)
	p.refresh(h.nodes)
}

// planHeld ends workload key's hold once planned members are reserved in
// the ledger: their plans took their holds' place; a held member not
// planned now is released.
func (p *GangPlanner) planHeld(key string, planned []types.UID) {
	h := p.holds[key]
	if h == nil {
		return
	}
	delete(p.holds, key)
	p.ledger.ReleaseGang(uidsBut(h.uids, uidSet(planned)))
	p.refresh(h.nodes)
}

// rehold counts workload key's hold in the ledger again, on the nodes as
// they are now (after its plan's reservation was released: the plan could
// not be written); the hold is dropped when that fails.
func (p *GangPlanner) rehold(key string) {
	h := p.holds[key]
	if h == nil {
		return
	}
	var err error
	for try := 0; try < 3; try++ {
		if err = p.ledger.ReserveGang(p.ledger.Snapshot(), h.uses); !errors.Is(err, ErrStaleSnapshot) {
			break
		}
	}
	if err != nil {
		delete(p.holds, key)
	}
	p.refresh(h.nodes)
}

// heldNodes are the nodes of every hold.
func (p *GangPlanner) heldNodes() map[string]bool {
	out := map[string]bool{}
	for _, h := range p.holds {
		for _, n := range h.nodes {
			out[n] = true
		}
	}
	return out
}

// heldWait is the waiting reason of a workload whose hold does not hold
// it (the room freed is not enough after all): consolidation moves
// nothing more for it until the hold ends.
func heldWait(h *freedHold) string {
	return fmt.Sprintf("consolidation: the pods it moved are leaving; nodes %s are held for it until %s, and nothing more is moved for it meanwhile",
		strings.Join(h.nodes, ", "), h.until.UTC().Format(time.RFC3339))
}
