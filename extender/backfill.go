package extender

import (
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/allocator/reserve"
	"github.com/tessera-gpu/tessera/api"
)

// BackfillView lets a pod use a reservation's room on the terms of
// allocator/reserve's Admit (reserve.go): the filter and the bind see a
// reserved node without the reservation's hold when the reservation admits
// the pod (it ends before the reservation starts by its
// tessera.dev/expected-runtime, or it is marked tessera.dev/preemptible).
// Pods that kube-scheduler places (no gang, no queue) are let in so; a
// planner's workload let in by the planner binds so (the reservation's
// hold stays counted in the ledger, beyond what is free, so that a GPU
// freed between passes goes to no one else).
type BackfillView interface {
	// View returns st as pod sees it.
	View(pod *corev1.Pod, st *NodeState) *NodeState
}

var _ BackfillView = (*GangPlanner)(nil)

// SetBackfill makes the filter and the bind ask v how a pod sees each
// node (nil: as the ledger counts it). Safe to call while serving.
func (s *Server) SetBackfill(v BackfillView) {
	if v == nil {
		s.backfill.Store(nil)
		return
	}
	s.backfill.Store(&v)
}

// viewFor is st as pod sees it (the ledger's state without a BackfillView).
func (s *Server) viewFor(pod *corev1.Pod, st *NodeState) *NodeState {
	v := s.backfill.Load()
	if v == nil || st == nil || pod == nil {
		return st
	}
	return (*v).View(pod, st)
}

// viewsFor is viewFor of each state.
func (s *Server) viewsFor(pod *corev1.Pod, states []*NodeState) []*NodeState {
	if s.backfill.Load() == nil {
		return states
	}
	out := make([]*NodeState, len(states))
	for i, st := range states {
		out[i] = s.viewFor(pod, st)
	}
	return out
}

// heldRoom is a reservation as the filter and the bind see it, published
// by the planner after each pass (they run on other goroutines).
type heldRoom struct {
	nodes  map[string]bool
	uids   map[types.UID]bool
	window reserve.Window
	at     time.Time
}

// views holds the planner's published reservations.
type views struct {
	rooms atomic.Pointer[[]heldRoom]
}

// publish makes the current reservations visible to View.
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
	p.views.rooms.Store(&rooms)
}

// View returns st without the hold of a reservation there that admits pod
// (allocator/reserve's Admit, with the reservation's window as of now);
// otherwise st. It is safe for concurrent use with Sync.
func (p *GangPlanner) View(pod *corev1.Pod, st *NodeState) *NodeState {
	cfg := p.reservation
	rooms := p.views.rooms.Load()
	if rooms == nil || (!cfg.Backfill && !cfg.Preemptible) {
		return st
	}
	for _, r := range *rooms {
		if !r.nodes[st.Info.Name] {
			continue
		}
		rt, marked := hints([]*corev1.Pod{pod})
		w := r.window
		if plan, ok, err := api.GetGangPlan(pod.Annotations); w.Known && !(ok && err == nil && plan.Node == st.Info.Name) {
			// Aged by the time since the pass; not for a member the
			// planner let in there (it was admitted on that window).
			w.In = max(0, w.In-p.now().Sub(r.at))
		}
		if cfg.policy(marked).Admit(rt, w) == reserve.Refused {
			return st
		}
		uses := make([]*PodUse, 0, len(st.Pods))
		for uid, u := range st.Pods {
			if !r.uids[uid] {
				uses = append(uses, u)
			}
		}
		return BuildNodeState(st.Info, uses)
	}
	return st
}
