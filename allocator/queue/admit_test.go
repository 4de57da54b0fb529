package queue

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/tessera-gpu/tessera/allocator/quota"
)

func TestAdmit(t *testing.T) {
	tests := []struct {
		name    string
		tree    *Tree
		used    map[string]int64
		pending map[string]int64
		queue   string
		req     quota.Resources
		want    Decision // Reason not compared
		wantMsg string   // a refusal containing this
	}{
		{
			name: "within guarantee at every level",
			tree: departments(), queue: "a1", req: gpus(4),
			want: Decision{Allowed: true},
		},
		{
			// a2 borrows 2 of a1's guarantee: a1 takes it back by
			// reclaim, so it does not borrow (seen on make demo: a team
			// within its guarantee was refused while its sibling borrowed
			// the whole department's, "would borrow ... 36 of 28").
			name: "within its team's guarantee while the sibling borrows the department's: within",
			tree: departments(), used: map[string]int64{"a2": 6}, queue: "a1", req: gpus(4),
			want: Decision{Allowed: true},
		},
		{
			name: "the sibling borrows the whole cluster: within",
			tree: departments(), used: map[string]int64{"a2": 16}, queue: "a1", req: gpus(4),
			want: Decision{Allowed: true},
		},
		{
			name: "a team within its guarantee, the department's guarantees overcommitted: borrows",
			tree: overcommitted(), used: map[string]int64{"a2": 4}, queue: "a1", req: gpus(6),
			want: Decision{Allowed: true, Borrowing: true},
		},
		{
			name: "a sibling above its own guarantee keeps its parent's share only",
			tree: Build([]Spec{q("d", "", 8), q("s", "d", 6), q("s1", "s", 2), q("s2", "s", 2), q("t", "d", 2, "ns")}),
			// s keeps max(6, 2+2) = 6 of its 10: t's 2 fit d's 8.
			used: map[string]int64{"s1": 10}, queue: "t", req: gpus(2),
			want: Decision{Allowed: true},
		},
		{
			name: "beyond capacity, the sibling within its guarantee",
			tree: departments(), used: map[string]int64{"a2": 4, "b1": 8, "b2": 4}, queue: "a1", req: gpus(1),
			want: Decision{Allowed: true},
		},
		{
			name: "a team borrows its idle sibling's guarantee",
			tree: departments(), used: map[string]int64{"a1": 4}, queue: "a1", req: gpus(4),
			want: Decision{Allowed: true, Borrowing: true},
		},
		{
			name: "a department borrows across departments",
			tree: departments(), used: map[string]int64{"a1": 4, "a2": 4}, queue: "a1", req: gpus(8),
			want: Decision{Allowed: true, Borrowing: true},
		},
		{
			name: "never what another queue's guarantee needs",
			tree: departments(), used: map[string]int64{"a1": 4, "a2": 4, "b1": 1}, pending: map[string]int64{"b1": 2, "b2": 9},
			queue: "a1", req: gpus(4),
			// dept-b (guarantee 8) uses 1 and asks 11 more: its
			// guarantee needs 7 of the 7 left.
			wantMsg: "queue a1 would borrow tessera.dev/gpu, but after the request the cluster would have 3 left while other queues' unmet guarantees need 7 (dept-b 7)",
		},
		{
			name: "the sibling team's unmet guarantee is not lent either",
			tree: departments(), used: map[string]int64{"a1": 4, "b1": 4, "b2": 4}, pending: map[string]int64{"a2": 3},
			queue: "a1", req: gpus(2),
			wantMsg: "other queues' unmet guarantees need 3 (a2 3)",
		},
		{
			name: "what the sibling does not ask for is lent",
			tree: departments(), used: map[string]int64{"a1": 4, "b1": 4, "b2": 4}, pending: map[string]int64{"a2": 2},
			queue: "a1", req: gpus(2),
			want: Decision{Allowed: true, Borrowing: true},
		},
		{
			name: "a team's limit",
			tree: Build([]Spec{q("d", "", 8), q("t", "d", 2, "ns").limit(4)}), used: map[string]int64{"t": 3}, queue: "t", req: gpus(2),
			wantMsg: "queue t would use 5 tessera.dev/gpu, above its limit 4",
		},
		{
			name: "a department's limit",
			tree: Build([]Spec{q("d", "", 2).limit(6), q("t", "d", 2)}), used: map[string]int64{"t": 5}, queue: "t", req: gpus(2),
			wantMsg: "queue d would use 7 tessera.dev/gpu, above its limit 6",
		},
		{
			name: "weight 0 borrows nothing",
			tree: Build([]Spec{q("t", "", 2).weigh(0)}), used: map[string]int64{"t": 2}, queue: "t", req: gpus(1),
			wantMsg: "queue t would use 3 tessera.dev/gpu, above its guarantee 2, and its weight for tessera.dev/gpu is 0: it borrows nothing",
		},
		{
			name: "weight 0 still admits within the guarantee",
			tree: Build([]Spec{q("t", "", 2).weigh(0)}), queue: "t", req: gpus(2),
			want: Decision{Allowed: true},
		},
		{
			name: "beyond capacity",
			tree: departments(), used: map[string]int64{"a1": 12, "b1": 4}, queue: "a1", req: gpus(1),
			wantMsg: "queue a1 would borrow tessera.dev/gpu, but the queues would use 17 of the cluster's 16",
		},
		{
			name: "a resource without capacity",
			tree: departments(), queue: "a1", req: quota.Resources{mem: 1},
			wantMsg: "would use 1 of the cluster's 0",
		},
		{
			name: "unknown queue", tree: departments(), queue: "nope", req: gpus(1),
			wantMsg: "queue nope is not defined",
		},
		{
			name: "a parent admits nothing itself", tree: departments(), queue: "dept-a", req: gpus(1),
			wantMsg: "queue dept-a has child queues (a1, a2): only leaf queues admit work",
		},
		{
			name: "invalid ancestor fails closed",
			tree: Build([]Spec{q("d", "missing", 8), q("t", "d", 4)}), queue: "t", req: gpus(1),
			wantMsg: "queue t admits nothing until it is fixed: queue t is under invalid queue d: queue d's parent missing is not defined",
		},
		{
			name: "invalid queue's running work still counts",
			tree: Build([]Spec{q("bad", "", 4).limit(2), q("ok", "", 4)}), used: map[string]int64{"bad": 14}, queue: "ok", req: gpus(4),
			want: Decision{Allowed: true},
		},
		{
			name: "invalid queue's running work still counts when borrowing",
			tree: Build([]Spec{q("bad", "", 4).limit(2), q("ok", "", 4)}), used: map[string]int64{"bad": 14, "ok": 2}, queue: "ok", req: gpus(3),
			wantMsg: "queue ok would borrow tessera.dev/gpu, but the queues would use 19 of the cluster's 16",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := state(tc.tree, tc.used, tc.pending).Admit(tc.queue, tc.req)
			if tc.wantMsg != "" {
				if got.Allowed || !strings.Contains(got.Reason, tc.wantMsg) {
					t.Fatalf("Admit = %+v, want refused with %q", got, tc.wantMsg)
				}
				return
			}
			if got.Reason == "" {
				t.Errorf("Admit gave no reason: %+v", got)
			}
			got.Reason = ""
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Admit (-want +got):\n%s", diff)
			}
		})
	}
}

// overcommitted is departments() whose dept-a's teams are guaranteed 6
// each of its 8.
func overcommitted() *Tree {
	return Build([]Spec{
		q("dept-a", "", 8), q("dept-b", "", 8),
		q("a1", "dept-a", 6, "ns-a1"), q("a2", "dept-a", 6, "ns-a2"),
		q("b1", "dept-b", 4, "ns-b1"), q("b2", "dept-b", 4, "ns-b2"),
	})
}

func TestAdmitBorrowingReasonNamesTheLevel(t *testing.T) {
	got := state(overcommitted(), map[string]int64{"a2": 4}, nil).Admit("a1", gpus(6))
	want := "queue a1 borrows: dept-a would use 10 tessera.dev/gpu, above its guarantee 8"
	if got.Reason != want {
		t.Errorf("Reason = %q, want %q", got.Reason, want)
	}
}

// Workloads larger than their queues' guarantees must borrow: lending
// protects only the waiting work that could start within a guarantee
// (State.Waiting), else two such workloads keep each other waiting for
// ever (found by the ITP replay, sim/jobs).
func TestLendingProtectsOnlyWorkThatFitsTheGuarantee(t *testing.T) {
	tree := Build([]Spec{q("a", "", 8), q("b", "", 8)})
	tests := []struct {
		name     string
		pendingB int64
		waiting  map[string][]quota.Resources
		want     bool
	}{
		{name: "no Waiting: b's whole pending demand is protected", pendingB: 16, want: false},
		{name: "b's 16-GPU job cannot start within its 8", pendingB: 16, waiting: map[string][]quota.Resources{"a": {gpus(16)}, "b": {gpus(16)}}, want: true},
		{name: "b's 2-GPU job could: 2 stay protected", pendingB: 18, waiting: map[string][]quota.Resources{"a": {gpus(16)}, "b": {gpus(16), gpus(2)}}, want: false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := state(tree, nil, map[string]int64{"a": 16, "b": tc.pendingB})
			s.Waiting = tc.waiting
			d := s.Admit("a", gpus(16))
			if d.Allowed != tc.want {
				t.Errorf("Admit(a, 16) = %+v, want allowed %v", d, tc.want)
			}
		})
	}
	// With b's 2-GPU job protected, a may still borrow up to 14.
	s := state(tree, nil, map[string]int64{"a": 14, "b": 18})
	s.Waiting = map[string][]quota.Resources{"a": {gpus(14)}, "b": {gpus(16), gpus(2)}}
	if d := s.Admit("a", gpus(14)); !d.Allowed {
		t.Errorf("Admit(a, 14) = %+v, want allowed (2 left for b's 2-GPU job)", d)
	}
}

// A queue whose object could not be read admits nothing, whatever it asks
// for (a MIG profile included, which no closed limit could list), and a
// queue under it neither; its siblings are unaffected.
func TestMalformedQueueAdmitsNothing(t *testing.T) {
	bad := Spec{Name: "dept-a", Malformed: `Queue dept-a: spec.resources["cpu"]: unknown resource`}
	lone := Spec{Name: "c1", Namespaces: []string{"ns-c1"}, Malformed: `Queue c1: spec.resources["tessera.dev/gpu"]: guaranteed (3) must not exceed limit (1)`}
	tree := Build([]Spec{bad, q("a1", "dept-a", 0, "ns-a1"), q("b1", "", 4, "ns-b1"), lone})
	mig := corev1.ResourceName("tessera.dev/mig-1g.5gb")
	s := &State{Tree: tree, Capacity: quota.Resources{gpu: 16, mig: 14}, Used: map[string]quota.Resources{}, Pending: map[string]quota.Resources{}}
	for _, tc := range []struct {
		queue   string
		req     quota.Resources
		allowed bool
		msg     string
	}{
		{"c1", quota.Resources{mig: 1}, false, `queue c1 admits nothing until it is fixed: Queue c1: spec.resources["tessera.dev/gpu"]: guaranteed (3)`},
		{"c1", gpus(1), false, "queue c1 admits nothing until it is fixed"},
		{"a1", quota.Resources{mig: 1}, false, `queue a1 is under invalid queue dept-a: Queue dept-a: spec.resources["cpu"]`},
		{"b1", quota.Resources{mig: 1}, true, ""},
	} {
		d := s.Admit(tc.queue, tc.req)
		if d.Allowed != tc.allowed || !strings.Contains(d.Reason, tc.msg) {
			t.Errorf("Admit(%s, %v) = %+v, want allowed %v with %q", tc.queue, tc.req, d, tc.allowed, tc.msg)
		}
	}
}
