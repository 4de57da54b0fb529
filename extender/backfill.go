package extender

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/extender/planner"
)

// BackfillView lets a pod use a reservation's room on the terms of
// allocator/reserve's Admit (planner/reserve.go): the filter and the bind see a
// reserved node without the reservation's hold when the reservation admits
// the pod (it ends before the reservation starts by its
// tessera.dev/expected-runtime, or it is marked tessera.dev/preemptible).
// Pods that kube-scheduler places (no gang, no queue) are let in so; a
// planner's workload let in by the planner binds so (the reservation's
// hold stays counted in the ledger, beyond what is free, so that a GPU
// freed between passes goes to no one else).
//
// The planner decides (planner.GangPlanner implements it); the filter and
// the bind rebuild the node's state without the pods it lifts.
type BackfillView interface {
	// Lifted returns the pods whose hold on node pod may use (nil: none;
	// the map is not to be changed).
	Lifted(pod *corev1.Pod, node string) map[types.UID]bool
}

var _ BackfillView = (*planner.GangPlanner)(nil)

// SetBackfill makes the filter and the bind ask v how a pod sees each
// node (nil: as the ledger counts it). Safe to call while serving.
func (s *Server) SetBackfill(v BackfillView) {
	if v == nil {
		s.backfill.Store(nil)
		return
	}
	s.backfill.Store(&v)
}

// ViewFor is st as pod sees it through the BackfillView set (SetBackfill);
// st itself without one.
func (s *Server) ViewFor(pod *corev1.Pod, st *NodeState) *NodeState {
	v := s.backfill.Load()
	if v == nil || st == nil || pod == nil {
		return st
	}
	return st.without((*v).Lifted(pod, st.Info.Name))
}

// viewsFor is ViewFor of each state.
func (s *Server) viewsFor(pod *corev1.Pod, states []*NodeState) []*NodeState {
	if s.backfill.Load() == nil {
		return states
	}
	out := make([]*NodeState, len(states))
	for i, st := range states {
		out[i] = s.ViewFor(pod, st)
	}
	return out
}
