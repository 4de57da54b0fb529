package extender

import (
	"context"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/extender/internal/testbuild"
)

// A PodDisruptionBudget is a preference for tier preemption, as for
// kube-scheduler's: a victim it protects is passed over while another
// choice makes room; when every choice needs one, with PastBudgets it is
// deleted past its budget (and its Event says so); without, the asker
// waits.
func TestTierPreemptionPastBudgets(t *testing.T) {
	twoGPUs := testbuild.Node("n1").GPUs(2, "A100", 40960).Obj()
	tests := []struct {
		name         string
		pdb          []string
		pastBudgets  bool
		gang         bool
		want, wantPB []string
	}{
		{
			name:        "an unprotected victim is taken before a protected one",
			pdb:         []string{"nb-new"},
			pastBudgets: true,
			want:        []string{"nb-old"},
		},
		{
			name:        "every victim protected: the cheapest is deleted past its budget",
			pdb:         []string{"nb-new", "nb-old"},
			pastBudgets: true,
			want:        []string{"nb-new"}, wantPB: []string{"nb-new"},
		},
		{
			name: "every victim protected, past budgets off: nothing goes",
			pdb:  []string{"nb-new", "nb-old"},
		},
		{
			name:        "a gang: every victim protected, both deleted past their budgets",
			pdb:         []string{"nb-new", "nb-old"},
			pastBudgets: true,
			gang:        true,
			want:        []string{"nb-new", "nb-old"}, wantPB: []string{"nb-new", "nb-old"},
		},
		{
			name: "a gang, past budgets off: nothing goes",
			pdb:  []string{"nb-new", "nb-old"},
			gang: true,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pods := []*corev1.Pod{
				running(testbuild.Pod("nb-old").Whole(1).Priority(notebook).Node("n1").Holding(0), 30),
				running(testbuild.Pod("nb-new").Whole(1).Priority(notebook).Node("n1").Holding(1), 10),
			}
			members := gangMembers("inf", 2, 1, inference)
			if tc.gang {
				pods = append(pods, members...)
			} else {
				pods = append(pods, asking(testbuild.Pod("inf").Whole(1).Priority(inference)))
			}
			node := twoGPUs.DeepCopy()
			node.Labels = map[string]string{"kubernetes.io/hostname": "n1"}
			cache := newTestCache(t, []*corev1.Node{node}, pods)
			client := &testbuild.PreemptClient{PDB: map[string]bool{}}
			for _, n := range tc.pdb {
				client.PDB[n] = true
			}
			rec := &testbuild.Recorder{}
			p := &Preemptor{Cache: cache, Client: client, Pods: func() ([]*corev1.Pod, error) { return pods, nil },
				Policy: testPolicy(t, PolicyBinpack), Events: rec, Now: func() time.Time { return preemptNow }}
			if tc.pastBudgets {
				p.PastBudgets = client
			}
			ctx := context.Background()
			if tc.gang {
				if _, _, err := forGang(p, ctx, members, nodesFree(1, 2, true)); err != nil {
					t.Fatal(err)
				}
			} else if err := p.Sync(ctx); err != nil {
				t.Fatal(err)
			}
			sort.Strings(client.Evicted)
			sort.Strings(client.PastBudget)
			if diff := cmp.Diff(tc.want, client.Evicted); diff != "" {
				t.Errorf("evicted (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantPB, client.PastBudget); diff != "" {
				t.Errorf("deleted past budgets (-want +got):\n%s", diff)
			}
			told := strings.Join(rec.Events, "\n")
			for _, n := range tc.wantPB {
				if !strings.Contains(told, api.EventPreempted+": ") || !strings.Contains(told, "deleted past its PodDisruptionBudget") {
					t.Errorf("no Preempted Event tells %s was deleted past its budget:\n%s", n, told)
				}
			}
			if len(tc.wantPB) == 0 && strings.Contains(told, "past its PodDisruptionBudget") {
				t.Errorf("an Event tells of a deletion past a budget that did not happen:\n%s", told)
			}
		})
	}
}
