package planner

import (
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"

	"github.com/tessera-gpu/tessera/api"
)

// GangBook is the gangs as the planner completed them on its last pass:
// for a gang declared by a PodGroup, api.GangOf knows neither its
// minMember nor its cap (they are in the PodGroup object, which the
// planner reads); its members' annotations alone gave minMember 0, so
// preemption and reclaim saw no extra members of an elastic PodGroup gang
// and took whole workloads instead (make demo: kube-scheduler preempted
// three one-GPU pods for a 4-GPU pod while a PodGroup gang ran a member
// beyond its minimum). The planner stores each pass's gangs; the
// preemptor, the preempt verb's quota and gang rules and queue reclaim
// read them through GangOf. A new extender knows nothing until its first
// pass, and GangOf then answers as api.GangOf (no extras: the gang is kept
// whole). Safe for concurrent use.
type GangBook struct {
	gangs atomic.Pointer[map[string]api.Gang]
}

// store replaces the book's gangs (by api.Gang.Key) with those of a pass.
func (b *GangBook) store(gangs map[string]api.Gang) {
	if b != nil {
		b.gangs.Store(&gangs)
	}
}

// GangOf is api.GangOf completed from the planner's last pass: the gang
// of pod as the planner planned it (its PodGroup's minMember and cap, the
// largest minimum and smallest cap its members declare), when the planner
// saw it from the same source; else api.GangOf's answer.
func (b *GangBook) GangOf(pod *corev1.Pod) (*api.Gang, bool, error) {
	g, ok, err := api.GangOf(pod)
	if !ok || err != nil || b == nil {
		return g, ok, err
	}
	if m := b.gangs.Load(); m != nil {
		if r, found := (*m)[g.Key()]; found && r.Source == g.Source {
			return &r, true, nil
		}
	}
	return g, ok, nil
}
