package quota_test

import (
	"sort"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	core "github.com/tessera-gpu/tessera/allocator/quota"
	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/extender/quota"
)

func TestPreemptVictimsKeepGangsWholeAndMins(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	mk := func(ns, name, node string, n int64, opts ...podOpt) *corev1.Pod {
		p := gpuPod(name, n, node)
		p.Namespace, p.UID, p.CreationTimestamp = ns, types.UID("uid-"+ns+"-"+name), metav1.NewTime(t0)
		for _, o := range opts {
			o(p)
		}
		return p
	}
	// a: min 16 uses 32 (gang g1 2x4 on n0, gang g2 2x4 spread over n0
	// and n1, p1 and p2 8 each on n1); b: min 16 uses 0.
	g1a := mk("a", "g1-0", "n0", 4, inGang("g1", 2))
	g1b := mk("a", "g1-1", "n0", 4, inGang("g1", 2))
	g2a := mk("a", "g2-0", "n0", 4, inGang("g2", 2))
	g2b := mk("a", "g2-1", "n1", 4, inGang("g2", 2))
	p1 := mk("a", "p1", "n1", 8)
	p2 := mk("a", "p2", "n1", 8)
	// Elastic gang e (minMember 1) of three members that started one
	// minute apart: e-0 (oldest) and e-2 (newest) on n0, e-1 on n1.
	started := func(m int) podOpt {
		return func(p *corev1.Pod) { p.Status.StartTime = &metav1.Time{Time: t0.Add(time.Duration(m) * time.Minute)} }
	}
	e0 := mk("a", "e-0", "n0", 1, inGang("e", 1), started(0))
	e1 := mk("a", "e-1", "n1", 1, inGang("e", 1), started(1))
	e2 := mk("a", "e-2", "n0", 1, inGang("e", 1), started(2))
	all := []*corev1.Pod{g1a, g1b, g2a, g2b, p1, p2, e0, e1, e2}
	quotas := staticQuotas{
		"a": {Namespace: "a", Min: gpus(16), Max: gpus(32)},
		"b": {Namespace: "b", Min: gpus(16), Max: gpus(32)},
	}
	st := &core.State{Quotas: quotas, Used: map[string]core.Resources{"a": gpus(32)}, Capacity: gpus(32)}
	view := &quota.View{State: st, Pods: all}
	members := func(g *api.Gang) []*corev1.Pod {
		var out []*corev1.Pod
		for _, p := range all {
			if mg, ok, _ := api.GangOf(p); ok && mg.Key() == g.Key() {
				out = append(out, p)
			}
		}
		return out
	}
	names := func(ps []*corev1.Pod) []string {
		var out []string
		for _, p := range ps {
			out = append(out, p.Name)
		}
		sort.Strings(out)
		return out
	}
	cases := []struct {
		name      string
		preemptor *corev1.Pod
		victims   []*corev1.Pod
		want      []string
		extra     []string
		dropped   []string
	}{{
		name:      "a whole gang on the node may go for b within its min",
		preemptor: mk("b", "x", "", 4), victims: []*corev1.Pod{g1a, g1b},
		want: []string{"g1-0", "g1-1"},
	}, {
		name:      "a gang with a member on another node is never broken",
		preemptor: mk("b", "x", "", 4), victims: []*corev1.Pod{g2a, g1a, g1b},
		want: []string{"g1-0", "g1-1"}, dropped: []string{"g2-0"},
	}, {
		name:      "not below the victim namespace's min",
		preemptor: mk("b", "x", "", 8), victims: []*corev1.Pod{p1, p2, g1a, g1b},
		want: []string{"p1", "p2"}, dropped: []string{"g1-0", "g1-1"},
	}, {
		name:      "a preemptor above its own min takes nothing from others",
		preemptor: mk("b", "x", "", 24), victims: []*corev1.Pod{p1},
		dropped: []string{"p1"},
	}, {
		name:      "an elastic gang's extra members go alone, newest first; the rest is never broken",
		preemptor: mk("a", "x", "", 1), victims: []*corev1.Pod{e0, e2},
		want: []string{"e-2"}, extra: []string{"e-2"}, dropped: []string{"e-0"},
	}, {
		name:      "both extras, on their own nodes",
		preemptor: mk("a", "x", "", 1), victims: []*corev1.Pod{e1},
		want: []string{"e-1"}, extra: []string{"e-1"},
	}, {
		name:      "same namespace: priority alone decides",
		preemptor: mk("a", "x", "", 8), victims: []*corev1.Pod{p1, p2, g1a, g1b},
		want: []string{"g1-0", "g1-1", "p1", "p2"},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			allowed, extra, dropped := quota.PreemptVictims(view, api.GangOf, members, tc.preemptor, quota.Use(tc.preemptor), tc.victims)
			if diff := cmp.Diff(tc.want, names(allowed)); diff != "" {
				t.Errorf("allowed (-want +got):\n%s", diff)
			}
			var extras []*corev1.Pod
			for _, p := range allowed {
				if extra[p.UID] {
					extras = append(extras, p)
				}
			}
			if diff := cmp.Diff(tc.extra, names(extras)); diff != "" {
				t.Errorf("extra members (-want +got):\n%s", diff)
			}
			var d []string
			for n := range dropped {
				d = append(d, n)
			}
			sort.Strings(d)
			if diff := cmp.Diff(tc.dropped, d); diff != "" {
				t.Errorf("dropped (-want +got):\n%s (reasons %v)", diff, dropped)
			}
		})
	}
}
