package extender

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/tessera-gpu/tessera/extender/internal/testbuild"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

func TestNodeStateAccounting(t *testing.T) {
	node := testbuild.Node("n1").GPUs(4, "NVIDIA A100-SXM4-40GB", 40960).Unhealthy(3).Obj()
	tests := []struct {
		name    string
		pods    []*corev1.Pod
		want    string // free milli/MiB per GPU
		pending int
	}{
		{name: "empty", want: "1000/40960 1000/40960 1000/40960 0/0"},
		{name: "shared slices add up on one GPU", pods: []*corev1.Pod{
			testbuild.Pod("a").Shared(10, 30).Node("n1").On(0, 10240, 30).Obj(),
			testbuild.Pod("b").Shared(5, 20).Node("n1").On(0, 5120, 20).Obj(),
		}, want: "500/25600 1000/40960 1000/40960 0/0"},
		{name: "recorded whole GPUs are used", pods: []*corev1.Pod{
			testbuild.Pod("a").Whole(2).Node("n1").Holding(1, 2).Obj(),
		}, want: "1000/40960 0/0 0/0 0/0"},
		{name: "unrecorded whole GPUs hold back free GPUs", pods: []*corev1.Pod{
			testbuild.Pod("a").Whole(2).Node("n1").Obj(),
		}, want: "1000/40960 0/0 0/0 0/0", pending: 2},
		{name: "pending whole GPUs skip shared GPUs", pods: []*corev1.Pod{
			testbuild.Pod("a").Shared(1, 10).Node("n1").On(2, 1024, 10).Obj(),
			testbuild.Pod("b").Whole(1).Node("n1").Obj(),
		}, want: "1000/40960 0/0 900/39936 0/0", pending: 1},
		{name: "unbound and finished pods do not count", pods: []*corev1.Pod{
			testbuild.Pod("a").Shared(1, 10).Obj(),
			func() *corev1.Pod {
				p := testbuild.Pod("b").Whole(1).Node("n1").Holding(0).Obj()
				p.Status.Phase = corev1.PodSucceeded
				return p
			}(),
		}, want: "1000/40960 1000/40960 1000/40960 0/0"},
		{name: "over-commitment clamps at zero", pods: []*corev1.Pod{
			testbuild.Pod("a").Shared(30, 80).Node("n1").On(0, 30720, 80).Obj(),
			testbuild.Pod("b").Shared(30, 80).Node("n1").On(0, 30720, 80).Obj(),
		}, want: "0/0 1000/40960 1000/40960 0/0"},
		{name: "a bound slice without an assignment holds a GPU", pods: []*corev1.Pod{
			testbuild.Pod("a").Shared(10, 10).Node("n1").Obj(),
		}, want: "1000/40960 1000/40960 0/0 0/0", pending: 1},
		{name: "malformed assignment counts whole GPUs as pending", pods: []*corev1.Pod{
			testbuild.Pod("a").Whole(1).Node("n1").RawAssignment("{").Obj(),
		}, want: "1000/40960 1000/40960 0/0 0/0", pending: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st := mustState(t, newTestCache(t, []*corev1.Node{node}, tc.pods), "n1")
			if diff := cmp.Diff(tc.want, freeOf(st)); diff != "" {
				t.Errorf("free (-want +got):\n%s", diff)
			}
			if st.PendingWhole != tc.pending {
				t.Errorf("PendingWhole = %d, want %d", st.PendingWhole, tc.pending)
			}
		})
	}
}

func TestMalformedInventory(t *testing.T) {
	c := newTestCache(t, []*corev1.Node{testbuild.Node("bad").RawInventory(`{"apiVersion":"x"}`).Obj()}, nil)
	st := mustState(t, c, "bad")
	if st.Info.Err == nil {
		t.Fatal("malformed inventory not reported")
	}
	d := Demand{WholeGPUs: 1}
	if v := Filter(st, &d); v.Reason != BadInventory || !v.Reason.Unresolvable() {
		t.Errorf("Filter() = %+v, want unresolvable %s", v, BadInventory)
	}
}

// TestReservationLifecycle checks that a placement decided at bind is
// counted at once and kept until the informer shows the pod bound with
// its assignment, and dropped on rollback or deletion.
func TestReservationLifecycle(t *testing.T) {
	node := testbuild.Node("n1").GPUs(2, "A100", 40960).Obj()
	c := newTestCache(t, []*corev1.Node{node}, nil)
	uid := types.UID("uid-p")
	reserve := func() {
		t.Helper()
		_, err := c.Reserve(uid, "n1", func(st *NodeState) (*PodUse, error) {
			return &PodUse{UID: uid, Shared: []SharedUse{{Container: "main", UUID: testbuild.GPUUUID("n1", 0), MemMiB: 10240, Cores: 50}}}, nil
		})
		if err != nil {
			t.Fatalf("Reserve() error = %v", err)
		}
	}
	check := func(step, want string) {
		t.Helper()
		if got := freeOf(mustState(t, c, "n1")); got != want {
			t.Errorf("%s: free = %q, want %q", step, got, want)
		}
	}
	reserve()
	check("reserved", "500/30720 1000/40960")

	// The assignment patch shows up first: the pod is not bound yet.
	unbound := testbuild.Pod("p").Shared(10, 50).Node("n1").On(0, 10240, 50).Obj()
	unbound.Spec.NodeName = ""
	c.SetPod(unbound)
	check("assignment seen, not bound", "500/30720 1000/40960")
	if _, ok := c.Reservation(uid); !ok {
		t.Fatal("reservation dropped before the pod was seen bound")
	}
	// Bound, with its assignment: the pod takes over, counted once.
	c.SetPod(testbuild.Pod("p").Shared(10, 50).Node("n1").On(0, 10240, 50).Obj())
	check("bound", "500/30720 1000/40960")
	if _, ok := c.Reservation(uid); ok {
		t.Error("reservation kept after the pod was seen bound")
	}
	c.DeletePod(uid)
	check("deleted", "1000/40960 1000/40960")

	// Rollback.
	reserve()
	c.Unreserve(uid)
	check("rolled back", "1000/40960 1000/40960")

	// Deleted before it was seen bound.
	reserve()
	c.DeletePod(uid)
	check("deleted while reserved", "1000/40960 1000/40960")

	// Bound elsewhere.
	reserve()
	c.SetPod(testbuild.Pod("p").Shared(10, 50).Node("n2").Obj())
	check("bound elsewhere", "1000/40960 1000/40960")

	// A failing decision leaves no reservation; unknown nodes are errors.
	wantErr := errors.New("no")
	if _, err := c.Reserve("x", "n1", func(*NodeState) (*PodUse, error) { return nil, wantErr }); !errors.Is(err, wantErr) {
		t.Errorf("Reserve() error = %v, want %v", err, wantErr)
	}
	if _, err := c.Reserve("x", "nope", func(*NodeState) (*PodUse, error) { return &PodUse{}, nil }); !errors.Is(err, ErrNoNode) {
		t.Errorf("Reserve() on unknown node error = %v, want ErrNoNode", err)
	}
	if n := c.Reservations(); n != 0 {
		t.Errorf("Reservations() = %d, want 0", n)
	}
}

func TestWholeReservationUntilNodeAgentRecords(t *testing.T) {
	c := newTestCache(t, []*corev1.Node{testbuild.Node("n1").GPUs(2, "A100", 40960).Obj()}, nil)
	uid := types.UID("uid-w")
	if _, err := c.Reserve(uid, "n1", func(st *NodeState) (*PodUse, error) {
		return &PodUse{UID: uid, WholePending: 1}, nil
	}); err != nil {
		t.Fatal(err)
	}
	if st := mustState(t, c, "n1"); st.PendingWhole != 1 || st.FreeGPUs() != 1 {
		t.Fatalf("reserved: pending %d free %d, want 1 1", st.PendingWhole, st.FreeGPUs())
	}
	c.SetPod(testbuild.Pod("w").Whole(1).Node("n1").Obj())
	if st := mustState(t, c, "n1"); st.PendingWhole != 1 || st.FreeGPUs() != 1 {
		t.Fatalf("bound: pending %d free %d, want 1 1", st.PendingWhole, st.FreeGPUs())
	}
	c.SetPod(testbuild.Pod("w").Whole(1).Node("n1").Holding(0).Obj())
	st := mustState(t, c, "n1")
	if st.PendingWhole != 0 || freeOf(st) != "0/0 1000/40960" {
		t.Fatalf("recorded: pending %d free %q", st.PendingWhole, freeOf(st))
	}
}
