package extender

import (
	"math"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/internal/eligible"
)

// preemptCandidate is one node's answer to kube-scheduler's preemption
// dry run, as the preempt verb is about to return it.
type preemptCandidate struct {
	victims []types.UID
	// extra are the victims that are extra members of elastic gangs
	// (beyond their minMember).
	extra map[types.UID]bool
	pdb   int64
}

// extrasFirst drops the candidate nodes on which a whole workload would be
// preempted while another candidate, no worse by kube-scheduler's first
// two criteria (fewest budget violations, then the lowest highest victim
// priority), takes only extra members of elastic gangs at that priority:
// under pressure an elastic gang gives back its extra members before any
// whole workload goes (allocator/preempt orders its units the same way).
// kube-scheduler then picks among the nodes left by its own criteria, the
// victims that started last among them. st gives the node states whose
// pods' priorities count; a victim it does not know (a pod without GPUs)
// keeps its node from being the one preferred.
func extrasFirst(cands map[string]preemptCandidate, st func(node string) (*NodeState, bool)) {
	type rank struct {
		pdb       int64
		top       int32
		onlyExtra bool // every victim at the top priority is an extra member
		known     bool // every victim is a GPU pod of the node state
	}
	ranks := make(map[string]rank, len(cands))
	for node, c := range cands {
		r := rank{pdb: c.pdb, top: math.MinInt32, onlyExtra: true, known: true}
		s, _ := st(node)
		for _, uid := range c.victims {
			var u *PodUse
			if s != nil {
				u = s.Pods[uid]
			}
			if u == nil {
				r.known = false
				continue
			}
			switch {
			case u.Priority > r.top:
				r.top, r.onlyExtra = u.Priority, c.extra[uid]
			case u.Priority == r.top:
				r.onlyExtra = r.onlyExtra && c.extra[uid]
			}
		}
		ranks[node] = r
	}
	for node, n := range ranks {
		if n.onlyExtra {
			continue
		}
		for other, m := range ranks {
			if other != node && m.known && m.onlyExtra && m.pdb <= n.pdb && m.top <= n.top {
				delete(cands, node)
				break
			}
		}
	}
}

// answerMemory is how long the preempt verb remembers the victims it
// offered for a pod: kube-scheduler evicts them asynchronously and may ask
// again for the same pod before its informer shows them leaving.
const answerMemory = 30 * time.Second

// preemptAnswers remembers, per pod, the victims the preempt verb offered
// on each node lately.
type preemptAnswers struct {
	mu      sync.Mutex
	answers map[types.UID]preemptAnswer
}

type preemptAnswer struct {
	at      time.Time
	victims map[string][]types.UID // node -> victims offered there
}

// remember records the victims offered for pod at now, and forgets the
// answers older than answerMemory.
func (a *preemptAnswers) remember(pod types.UID, cands map[string]preemptCandidate, now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.answers == nil {
		a.answers = map[types.UID]preemptAnswer{}
	}
	for uid, ans := range a.answers {
		if now.Sub(ans.at) > answerMemory {
			delete(a.answers, uid)
		}
	}
	v := make(map[string][]types.UID, len(cands))
	for node, c := range cands {
		v[node] = c.victims
	}
	a.answers[pod] = preemptAnswer{at: now, victims: v}
}

// offered returns the victims offered for pod on node within
// answerMemory of now.
func (a *preemptAnswers) offered(pod types.UID, node string, now time.Time) []types.UID {
	a.mu.Lock()
	defer a.mu.Unlock()
	ans, ok := a.answers[pod]
	if !ok || now.Sub(ans.at) > answerMemory {
		return nil
	}
	return ans.victims[node]
}

// roomBeingFreed reports whether pod (asking d) fits on one of nodes once
// the pods leaving there are gone: those being deleted, and, on the node
// kube-scheduler nominated for it, the victims this verb offered there
// lately (kube-scheduler evicts them asynchronously and retries at once,
// before the informers show them leaving). Then no more is preempted for
// it: kube-scheduler places it when they are gone (a second preemption
// for the same pod was seen in the e2e suite, a whole notebook taken after
// an elastic gang's extra member had been).
func (s *Server) roomBeingFreed(pod *corev1.Pod, d *Demand, nodes []string, now time.Time) bool {
	allowed := eligible.For(pod)
	nominated := pod.Status.NominatedNodeName
	if nominated != "" {
		nodes = append(nodes, nominated)
	}
	for _, name := range nodes {
		st, ok := s.state.Node(name)
		if !ok || !st.Admits(allowed) {
			continue
		}
		gone := map[types.UID]bool{}
		for uid, u := range st.Pods {
			if u.Leaving {
				gone[uid] = true
			}
		}
		if name == nominated {
			for _, uid := range s.answers.offered(pod.UID, name, now) {
				gone[uid] = true
			}
		}
		if len(gone) > 0 && Check(st.without(gone), d) == Fits {
			return true
		}
	}
	return false
}
