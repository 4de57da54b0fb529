package extender

import (
	"sort"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/types"
)

func TestExtrasFirst(t *testing.T) {
	// Node states: pods by UID with their priorities.
	states := map[string]*NodeState{}
	pod := func(node, uid string, prio int32) types.UID {
		st := states[node]
		if st == nil {
			st = &NodeState{Pods: map[types.UID]*PodUse{}}
			states[node] = st
		}
		st.Pods[types.UID(uid)] = &PodUse{UID: types.UID(uid), Priority: prio}
		return types.UID(uid)
	}
	whole := pod("n-whole", "w", 0)
	extra := pod("n-extra", "e", 0)
	extraHigh := pod("n-extra-high", "eh", 10)
	low := pod("n-low", "l", -5)
	mixedE, mixedW := pod("n-mixed", "me", 0), pod("n-mixed", "mw", 0)
	lookup := func(node string) (*NodeState, bool) { st, ok := states[node]; return st, ok }
	cand := func(pdb int64, extras []types.UID, victims ...types.UID) preemptCandidate {
		c := preemptCandidate{victims: victims, pdb: pdb, extra: map[types.UID]bool{}}
		for _, e := range extras {
			c.extra[e] = true
		}
		return c
	}
	for _, tc := range []struct {
		name  string
		cands map[string]preemptCandidate
		want  []string
	}{{
		name:  "an extra member goes before a whole workload of the same priority",
		cands: map[string]preemptCandidate{"n-whole": cand(0, nil, whole), "n-extra": cand(0, []types.UID{extra}, extra), "n-mixed": cand(0, []types.UID{mixedE}, mixedE, mixedW)},
		want:  []string{"n-extra"},
	}, {
		name:  "a whole workload of lower priority goes before an extra member",
		cands: map[string]preemptCandidate{"n-low": cand(0, nil, low), "n-extra": cand(0, []types.UID{extra}, extra)},
		want:  []string{"n-extra", "n-low"},
	}, {
		name:  "an extra of a higher priority does not push out a whole workload of a lower one",
		cands: map[string]preemptCandidate{"n-whole": cand(0, nil, whole), "n-extra-high": cand(0, []types.UID{extraHigh}, extraHigh)},
		want:  []string{"n-extra-high", "n-whole"},
	}, {
		name:  "budgets come first",
		cands: map[string]preemptCandidate{"n-whole": cand(0, nil, whole), "n-extra": cand(1, []types.UID{extra}, extra)},
		want:  []string{"n-extra", "n-whole"},
	}, {
		name:  "a victim the ledger does not know keeps its node from being preferred",
		cands: map[string]preemptCandidate{"n-whole": cand(0, nil, whole), "n-extra": cand(0, []types.UID{extra}, extra, "cpu-only")},
		want:  []string{"n-extra", "n-whole"},
	}, {
		name:  "no extra anywhere: every node stays",
		cands: map[string]preemptCandidate{"n-whole": cand(0, nil, whole), "n-low": cand(0, nil, low)},
		want:  []string{"n-low", "n-whole"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			extrasFirst(tc.cands, lookup)
			var got []string
			for n := range tc.cands {
				got = append(got, n)
			}
			sort.Strings(got)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("nodes left (-want +got):\n%s", diff)
			}
		})
	}
}
