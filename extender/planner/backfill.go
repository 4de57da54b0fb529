package planner

import (
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/allocator/reserve"
	"github.com/tessera-gpu/tessera/api"
)

// Backfill: reservations as the filter and the bind see them
// (extender.BackfillView asks Lifted).

// heldRoom is a reservation as the filter and the bind see it, published
// by the planner after each pass (they run on other goroutines).
type heldRoom struct {
	// closed marks room consolidation freed for a workload (freedHold):
	// it admits no one.
	closed bool
	nodes  map[string]bool
	uids   map[types.UID]bool
	window reserve.Window
	at     time.Time
}

// views holds the planner's published reservations.
type views struct {
	rooms atomic.Pointer[[]heldRoom]
}

// publish makes the current reservations visible to Lifted.
func (p *GangPlanner) publish() {
	rooms := make([]heldRoom, 0, len(p.reserved))
	for _, r := range p.reserved {
		h := heldRoom{nodes: map[string]bool{}, uids: map[types.UID]bool{}, window: r.window, at: r.at}
		for _, n := range r.nodes {
			h.nodes[n] = true
		}
		for _, uid := range r.uids {
			h.uids[uid] = true
		}
		rooms = append(rooms, h)
	}
	for _, fh := range p.holds {
		h := heldRoom{closed: true, nodes: map[string]bool{}}
		for _, n := range fh.nodes {
			h.nodes[n] = true
		}
		rooms = append(rooms, h)
	}
	p.views.rooms.Store(&rooms)
}

// Lifted returns the pods whose hold on node pod may use: those of a
// reservation there that admits pod (allocator/reserve's Admit, with the
// reservation's window as of now); nil when none does. The filter and the
// bind see the node without them (extender.BackfillView: a pod uses a
// reservation's room on the terms of Admit: it ends before the
// reservation starts by its tessera.dev/expected-runtime, or it is marked
// tessera.dev/preemptible). Room consolidation freed for a workload and
// holds for it (freedHold) admits no pod: nil on its nodes. It is safe
// for concurrent use with Sync.
func (p *GangPlanner) Lifted(pod *corev1.Pod, node string) map[types.UID]bool {
	cfg := p.reservation
	rooms := p.views.rooms.Load()
	if rooms == nil || (!cfg.Backfill && !cfg.Preemptible) {
		return nil
	}
	for _, r := range *rooms {
		if r.closed && r.nodes[node] {
			return nil // freed by consolidation for a workload: no backfill, preemptible or not
		}
	}
	for _, r := range *rooms {
		if r.closed || !r.nodes[node] {
			continue
		}
		rt, marked := hints([]*corev1.Pod{pod})
		w := r.window
		if plan, ok, err := api.GetGangPlan(pod.Annotations); w.Known && !(ok && err == nil && plan.Node == node) {
			// Aged by the time since the pass; not for a member the
			// planner let in there (it was admitted on that window).
			w.In = max(0, w.In-p.now().Sub(r.at))
		}
		if cfg.policy(marked).AdmitNew(rt, w) == reserve.Refused {
			return nil
		}
		return r.uids
	}
	return nil
}
