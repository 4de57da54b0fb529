package planner_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/extender"
	"github.com/tessera-gpu/tessera/extender/internal/testbuild"
	"github.com/tessera-gpu/tessera/extender/planner"
)

// TestGangTimeout: a gang's timeout is its own (annotation, PodGroup,
// default) up to the operator's --gang-timeout-max, and cut to it beyond,
// with a note that says so.
func TestGangTimeout(t *testing.T) {
	const cutAsked = "the operator's --gang-timeout-max; the gang asked 9223372036s"
	huge := fmt.Sprint(api.MaxGangTimeoutSeconds)
	tests := []struct {
		name string
		// annotation is the pod's tessera.dev/gang-timeout-seconds ("":
		// unset); podGroup, when set, the spec.scheduleTimeoutSeconds of
		// the PodGroup the pod names (0: unset).
		annotation string
		podGroup   *int64
		limit      time.Duration
		want       time.Duration
		wantNote   string
	}{
		{name: "declared below the max is kept", annotation: "60", limit: 30 * time.Minute, want: time.Minute},
		{name: "declared at the max is kept", annotation: "1800", limit: 30 * time.Minute, want: 30 * time.Minute},
		{name: "declared above the max is cut", annotation: "1801", limit: 30 * time.Minute, want: 30 * time.Minute,
			wantNote: "the operator's --gang-timeout-max; the gang asked 1801s"},
		{name: "the longest declarable is cut", annotation: huge, limit: 30 * time.Minute, want: 30 * time.Minute, wantNote: cutAsked},
		{name: "default under the max", limit: 30 * time.Minute, want: api.DefaultGangTimeout},
		{name: "default cut by a max below it", limit: 5 * time.Minute, want: 5 * time.Minute,
			wantNote: "the operator's --gang-timeout-max; the default is 10m0s"},
		{name: "PodGroup's timeout below the max is kept", podGroup: ptr(int64(120)), limit: 30 * time.Minute, want: 2 * time.Minute},
		{name: "PodGroup's timeout above the max is cut", podGroup: ptr(api.MaxGangTimeoutSeconds), limit: 30 * time.Minute, want: 30 * time.Minute, wantNote: cutAsked},
		{name: "PodGroup without a timeout: the default", podGroup: ptr(int64(0)), limit: 30 * time.Minute, want: api.DefaultGangTimeout},
		{name: "the annotation over a PodGroup's is cut too", annotation: huge, podGroup: ptr(int64(60)), limit: 30 * time.Minute, want: 30 * time.Minute, wantNote: cutAsked},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pod := testbuild.Pod("w-0").Whole(8).Obj()
			if tc.podGroup != nil {
				pod.Labels = map[string]string{api.LabelPodGroup: "train"}
			} else {
				pod.Annotations[api.AnnotationGang] = "train"
				pod.Annotations[api.AnnotationGangMinMember] = "1"
			}
			if tc.annotation != "" {
				pod.Annotations[api.AnnotationGangTimeout] = tc.annotation
			}
			g, ok, err := api.GangOf(pod)
			if !ok || err != nil {
				t.Fatalf("GangOf: %v, %v", ok, err)
			}
			if tc.podGroup != nil {
				spec := map[string]any{"minMember": int64(1)}
				if *tc.podGroup > 0 {
					spec["scheduleTimeoutSeconds"] = *tc.podGroup
				}
				if err := g.ApplyPodGroup(podGroupObject(api.PodGroupGVR, "default", "train", spec), pod); err != nil {
					t.Fatalf("ApplyPodGroup: %v", err)
				}
			}
			d, note := planner.GangTimeout(g, tc.limit)
			if d != tc.want || note != tc.wantNote {
				t.Errorf("GangTimeout(%s, %s) = %s, %q; want %s, %q", g.Timeout, tc.limit, d, note, tc.want, tc.wantNote)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

// withTimeoutMax replaces the fixture's planner by one whose
// GangTimeoutMax is limit (a restart of the extender with
// --gang-timeout-max=limit).
func (f *gangFixture) withTimeoutMax(limit time.Duration) {
	f.planner = planner.NewGangPlanner(planner.GangPlannerConfig{
		Ledger: extender.PlannerLedger{Cache: f.cache}, Client: f.gangClient, Pods: f.plannerView,
		Policy: testPolicy(f.t, extender.PolicyBinpack), Events: f.events, Now: func() time.Time { return f.now },
		GangTimeoutMax: limit,
	})
}

// hugeTimeoutGang creates the hostile tenant's gang: one member of 8 GPUs
// (that kube-scheduler never binds in these tests) declaring the longest
// timeout there is.
func (f *gangFixture) hugeTimeoutGang() {
	f.t.Helper()
	f.member("g", 1, 0, 8, f.now)
	p, err := f.client.CoreV1().Pods("default").Get(context.Background(), "g-0", metav1.GetOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	p.Annotations[api.AnnotationGangTimeout] = fmt.Sprint(api.MaxGangTimeoutSeconds)
	if _, err := f.client.CoreV1().Pods(p.Namespace).Update(context.Background(), p, metav1.UpdateOptions{}); err != nil {
		f.t.Fatal(err)
	}
}

func (f *gangFixture) planExpires(name string) time.Time {
	f.t.Helper()
	p, err := f.client.CoreV1().Pods("default").Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	plan, ok, err := api.GetGangPlan(p.Annotations)
	if !ok || err != nil {
		f.t.Fatalf("pod %s: plan %v, %v", name, ok, err)
	}
	return plan.Expires
}

func (f *gangFixture) eventsOf(reason string) []string {
	var out []string
	for _, e := range f.events.Events {
		if strings.HasPrefix(e, reason+": ") {
			out = append(out, e)
		}
	}
	return out
}

// A gang that declares a timeout of 292 years, whose member never binds,
// holds its node no longer than the operator's --gang-timeout-max: its
// plan expires then, with Events that say the timeout was cut (it held
// the node's 8 GPUs until 2319).
func TestGangHugeTimeoutExpiresAtTheCap(t *testing.T) {
	for name, tc := range map[string]struct {
		limit, want time.Duration // limit 0: the planner's default
	}{
		"default max":      {0, planner.DefaultGangTimeoutMax},
		"operator's 5m":    {5 * time.Minute, 5 * time.Minute},
		"operator's 1h30m": {90 * time.Minute, 90 * time.Minute},
	} {
		t.Run(name, func(t *testing.T) {
			f := newGangFixture(t, testbuild.EightGPUNodes(1)...)
			if tc.limit > 0 {
				f.withTimeoutMax(tc.limit)
			}
			f.hugeTimeoutGang()
			f.sync()
			st := f.state("g-")["g-0"]
			if !st.planned || st.gated {
				t.Fatalf("g-0 not planned: %+v", st)
			}
			if got, want := f.planExpires("g-0"), f.now.Add(tc.want); !got.Equal(want) {
				t.Errorf("plan expires %s, want %s (now + %s)", got, want, tc.want)
			}
			note := fmt.Sprintf("%s (the operator's --gang-timeout-max; the gang asked 9223372036s)", tc.want)
			wantPlanned := []string{"GangPlanned: tessera: gang default/g planned in the cluster: this member on node " + st.node + "; the plan holds for " + note}
			if diff := cmp.Diff(wantPlanned, f.eventsOf("GangPlanned")); diff != "" {
				t.Errorf("GangPlanned Events (-want +got):\n%s", diff)
			}
			f.now = f.now.Add(tc.want - time.Second)
			f.sync()
			if len(f.evicted) != 0 {
				t.Fatalf("evicted %v before the cap", f.evicted)
			}
			f.now = f.now.Add(2 * time.Second)
			f.sync()
			if diff := cmp.Diff([]string{"g-0"}, f.evicted); diff != "" {
				t.Errorf("evicted at the cap (-want +got):\n%s", diff)
			}
			want := []string{"GangTimeout: tessera: gang default/g: plan expired after " + note + " with 1 of 1 planned members unbound (g-0); evicting all 1 members to retry the gang together"}
			if diff := cmp.Diff(want, f.eventsOf("GangTimeout")); diff != "" {
				t.Errorf("GangTimeout Events (-want +got):\n%s", diff)
			}
		})
	}
}

// A timeout within the cap is the gang's own, and its Events say nothing
// of the cap.
func TestGangTimeoutWithinTheCapIsKept(t *testing.T) {
	f := newGangFixture(t, testbuild.EightGPUNodes(1)...)
	f.member("g", 1, 0, 8, f.now) // 60 s
	f.sync()
	if got, want := f.planExpires("g-0"), f.now.Add(time.Minute); !got.Equal(want) {
		t.Errorf("plan expires %s, want %s", got, want)
	}
	f.now = f.now.Add(61 * time.Second)
	f.sync()
	want := []string{"GangTimeout: tessera: gang default/g: plan expired after 1m0s with 1 of 1 planned members unbound (g-0); evicting all 1 members to retry the gang together"}
	if diff := cmp.Diff(want, f.eventsOf("GangTimeout")); diff != "" {
		t.Errorf("GangTimeout Events (-want +got):\n%s", diff)
	}
	for _, e := range f.events.Events {
		if strings.Contains(e, "gang-timeout-max") {
			t.Errorf("Event %q names the cap of a timeout within it", e)
		}
	}
}

// A plan written under a longer bound (before --gang-timeout-max, as on
// the demo cluster: it held until 2319) expires the cap after the
// planner, restarted with the bound, first sees it.
func TestGangPlanMadeBeforeTheCapExpiresAtIt(t *testing.T) {
	f := newGangFixture(t, testbuild.EightGPUNodes(1)...)
	f.withTimeoutMax(time.Duration(api.MaxGangTimeoutSeconds) * time.Second) // the old planner: no bound
	f.hugeTimeoutGang()
	f.sync()
	if got := f.planExpires("g-0"); got.Year() < 2300 {
		t.Fatalf("the unbounded planner's plan expires %s, want in 2318", got)
	}
	f.now = f.now.Add(time.Hour)
	f.withTimeoutMax(0) // restarted with the default bound, 30m
	f.sync()
	f.now = f.now.Add(30 * time.Minute)
	f.sync()
	if len(f.evicted) != 0 {
		t.Fatalf("evicted %v before the cap", f.evicted)
	}
	f.now = f.now.Add(time.Second)
	f.sync()
	if diff := cmp.Diff([]string{"g-0"}, f.evicted); diff != "" {
		t.Errorf("evicted at the cap (-want +got):\n%s", diff)
	}
	if ev := f.eventsOf("GangTimeout"); len(ev) != 1 || !strings.Contains(ev[0], "plan expired after 30m0s (the operator's --gang-timeout-max; the gang asked 9223372036s)") {
		t.Errorf("GangTimeout Events %q", ev)
	}
}
