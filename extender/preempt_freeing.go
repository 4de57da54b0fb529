package extender

import (
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/internal/eligible"
)

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

// RoomBeingFreed reports whether nothing more should be evicted for pod
// (trusted) on nodes: its room is planned (a gang's, or held by Tessera's
// preemption or reclaim), or pods leaving one of nodes free enough for it
// (roomBeingFreed). The preempt verb answers no victims then;
// tessera-scheduler keeps kube-scheduler's DefaultPreemption, which counts
// GPUs per node and not which ones, from choosing victims of its own.
func (s *Server) RoomBeingFreed(pod *corev1.Pod, nodes []string) bool {
	if roomPlanned(pod) {
		return true
	}
	d, err := ParseDemand(pod)
	if err != nil {
		return false
	}
	return s.roomBeingFreed(pod, &d, nodes, s.preemptNow())
}

// preemptNow is the preempt verb's clock: s.now, or the wall clock.
func (s *Server) preemptNow() time.Time {
	if s.now != nil {
		return s.now()
	}
	return time.Now()
}

// roomPlanned reports that pod's room is planned (a gang's, or held by
// Tessera's preemption or reclaim): nothing more is evicted for it.
func roomPlanned(pod *corev1.Pod) bool {
	_, planned := pod.Annotations[api.AnnotationGangPlan]
	return planned
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
