package extender

import (
	"context"
	"errors"
	"maps"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/google/go-cmp/cmp"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/extender/internal/testbuild"
	"github.com/tessera-gpu/tessera/extender/planner"
	"github.com/tessera-gpu/tessera/extender/verbs"
)

// withPlan returns pod with a gang plan on node (and GPU position gpu of
// that node for a shared member; -1: none).
func withPlan(t testing.TB, pod *corev1.Pod, node string, gpu int) *corev1.Pod {
	t.Helper()
	p := pod.DeepCopy()
	plan := api.GangPlan{Gang: "g", Node: node, Expires: time.Now().Add(time.Hour)}
	if gpu >= 0 {
		plan.GPU = &api.GPURef{UUID: testbuild.GPUUUID(node, gpu), Index: gpu}
	}
	ann, err := testbuild.Sealer(t).GangPlanAnnotations(p.UID, plan)
	if err != nil {
		t.Fatal(err)
	}
	maps.Copy(p.Annotations, ann)
	return p
}

func TestLedgerCountsPlannedMembers(t *testing.T) {
	nodes := []*corev1.Node{testbuild.Node("a").GPUs(4, "A100", 40960).Obj(), testbuild.Node("b").GPUs(4, "A100", 40960).Obj()}
	whole := withPlan(t, testbuild.Pod("w").Whole(3).Obj(), "a", -1)
	shared := withPlan(t, testbuild.Pod("s").Shared(10, 50).Obj(), "b", 2)
	plain := testbuild.Pod("unplanned").Whole(4).Obj() // pending, no plan: not counted
	c := newTestCache(t, nodes, []*corev1.Pod{whole, shared, plain})
	if st := mustState(t, c, "a"); st.FreeGPUs() != 1 || st.PendingWhole != 3 {
		t.Errorf("node a: %d free GPUs, %d pending, want 1 and 3", st.FreeGPUs(), st.PendingWhole)
	}
	if got := freeOf(mustState(t, c, "b")); got != "1000/40960 1000/40960 500/30720 1000/40960" {
		t.Errorf("node b free = %q: the shared member's slice must be on GPU 2", got)
	}
	// Deleting the plan annotation (a released plan) frees the room.
	released := whole.DeepCopy()
	delete(released.Annotations, api.AnnotationGangPlan)
	c.SetPod(released)
	if st := mustState(t, c, "a"); st.FreeGPUs() != 4 {
		t.Errorf("after release node a has %d free GPUs, want 4", st.FreeGPUs())
	}
	// A malformed plan is not counted (and does not crash).
	bad := testbuild.Pod("bad").Whole(2).Obj()
	bad.Annotations[api.AnnotationGangPlan] = `{"apiVersion":"x"}`
	if u := c.SetPod(bad); u != nil {
		t.Errorf("malformed plan counted: %+v", u)
	}
}

func TestFilterPassesOnlyPlannedNode(t *testing.T) {
	nodes := []*corev1.Node{testbuild.Node("a").GPUs(8, "A100", 40960).Obj(), testbuild.Node("b").GPUs(8, "A100", 40960).Obj(), testbuild.Node("c").GPUs(8, "A100", 40960).Obj()}
	// The member fills node b exactly: filter must not count it against
	// itself.
	pod := withPlan(t, testbuild.Pod("m").Whole(8).Obj(), "b", -1)
	f := newFixture(t, nodes, []*corev1.Pod{pod}, pod)
	names := []string{"a", "b", "c"}
	var res extenderv1.ExtenderFilterResult
	f.post(t, verbs.PathFilter, &extenderv1.ExtenderArgs{Pod: pod, NodeNames: &names}, &res)
	if res.Error != "" || res.NodeNames == nil || strings.Join(*res.NodeNames, ",") != "b" {
		t.Fatalf("filter passed %v (error %q), want only b", res.NodeNames, res.Error)
	}
	for _, n := range []string{"a", "c"} {
		if msg := res.FailedAndUnresolvableNodes[n]; !strings.Contains(msg, "planned this pod on node b") {
			t.Errorf("node %s: reason %q", n, msg)
		}
	}
	// A plan Tessera did not seal (a tenant's, garbage or copied from
	// another pod) is ignored: the pod is filtered as an ordinary pod.
	for name, mutate := range map[string]func(*corev1.Pod){
		"garbage":     func(p *corev1.Pod) { p.Annotations[api.AnnotationGangPlan] = "{" },
		"no seal":     func(p *corev1.Pod) { delete(p.Annotations, api.AnnotationGangPlanSeal) },
		"other pod's": func(p *corev1.Pod) { p.UID = "uid-other" },
		"plan on a, b's seal": func(p *corev1.Pod) {
			p.Annotations[api.AnnotationGangPlan] = strings.Replace(p.Annotations[api.AnnotationGangPlan], `"node":"b"`, `"node":"a"`, 1)
		},
	} {
		bad := pod.DeepCopy()
		mutate(bad)
		res = extenderv1.ExtenderFilterResult{}
		f.post(t, verbs.PathFilter, &extenderv1.ExtenderArgs{Pod: bad, NodeNames: &names}, &res)
		if res.Error != "" || res.NodeNames == nil || strings.Join(*res.NodeNames, ",") != "a,c" {
			t.Errorf("%s plan: filter passed %v (error %q), want a,c (b is full with the pod's own sealed plan in the ledger)", name, res.NodeNames, res.Error)
		}
		for n, msg := range res.FailedAndUnresolvableNodes {
			if strings.Contains(msg, "planned") {
				t.Errorf("%s plan: node %s refused for a plan: %q", name, n, msg)
			}
		}
	}
}

func TestBindChecksPlan(t *testing.T) {
	nodes := []*corev1.Node{testbuild.Node("a").GPUs(8, "A100", 40960).Obj(), testbuild.Node("b").GPUs(8, "A100", 40960).Obj()}
	pod := withPlan(t, testbuild.Pod("m").Whole(8).Obj(), "b", -1)
	f := newFixture(t, nodes, []*corev1.Pod{pod}, pod)
	var res extenderv1.ExtenderBindingResult
	f.post(t, verbs.PathBind, &extenderv1.ExtenderBindingArgs{PodNamespace: "default", PodName: "m", PodUID: pod.UID, Node: "a"}, &res)
	if !strings.Contains(res.Error, ErrNotPlannedNode.Error()) {
		t.Errorf("bind to the wrong node: error %q", res.Error)
	}
	if st := mustState(t, f.cache, "a"); st.FreeGPUs() != 8 {
		t.Errorf("a failed bind left %d free GPUs on a", st.FreeGPUs())
	}
	res = extenderv1.ExtenderBindingResult{}
	f.post(t, verbs.PathBind, &extenderv1.ExtenderBindingArgs{PodNamespace: "default", PodName: "m", PodUID: pod.UID, Node: "b"}, &res)
	if res.Error != "" {
		t.Fatalf("bind to the planned node (which the member fills exactly): %q", res.Error)
	}
	if st := mustState(t, f.cache, "b"); st.FreeGPUs() != 0 || st.PendingWhole != 8 {
		t.Errorf("node b after bind: %d free, %d pending; want 0 and 8 (counted once)", st.FreeGPUs(), st.PendingWhole)
	}
}

func TestBindSharedMemberUsesPlannedGPU(t *testing.T) {
	node := testbuild.Node("n").GPUs(4, "A100", 40960).Obj()
	pod := withPlan(t, testbuild.Pod("s").Shared(10, 50).Obj(), "n", 3)
	f := newFixture(t, []*corev1.Node{node}, []*corev1.Pod{pod}, pod)
	var res extenderv1.ExtenderBindingResult
	f.post(t, verbs.PathBind, &extenderv1.ExtenderBindingArgs{PodNamespace: "default", PodName: "s", PodUID: pod.UID, Node: "n"}, &res)
	if res.Error != "" {
		t.Fatalf("bind: %q", res.Error)
	}
	got, _ := f.pods.GetPod(context.Background(), "default", "s")
	a, ok, err := api.GetAssignment(got.Annotations)
	if err != nil || !ok || a.Containers[0].Shared == nil || a.Containers[0].Shared.GPU.UUID != testbuild.GPUUUID("n", 3) {
		t.Fatalf("assignment %+v (ok %v, err %v), want the planned GPU 3", a, ok, err)
	}
	if got := freeOf(mustState(t, f.cache, "n")); got != "1000/40960 1000/40960 1000/40960 500/30720" {
		t.Errorf("free = %q, want the slice counted once on GPU 3", got)
	}
}

func TestReserveGangAllOrNothing(t *testing.T) {
	nodes := []*corev1.Node{testbuild.Node("a").GPUs(8, "A100", 40960).Obj(), testbuild.Node("b").GPUs(8, "A100", 40960).Obj()}
	c := newTestCache(t, nodes, nil)
	snap := c.Snapshot()
	// A bind on b after the snapshot makes the gang's plan stale.
	if _, err := c.Reserve("other", "b", func(st *NodeState) (*PodUse, error) {
		return &PodUse{UID: "other", WholePending: 1}, nil
	}); err != nil {
		t.Fatal(err)
	}
	uses := []*PodUse{{UID: "g1", Node: "a", WholePending: 8}, {UID: "g2", Node: "b", WholePending: 8}}
	if err := c.ReserveGang(snap, uses); !errors.Is(err, planner.ErrStaleSnapshot) {
		t.Fatalf("ReserveGang on a stale snapshot: %v", err)
	}
	if mustState(t, c, "a").FreeGPUs() != 8 {
		t.Error("a stale gang reserved part of itself")
	}
	uses[1].WholePending = 7
	if err := c.ReserveGang(c.Snapshot(), uses); err != nil {
		t.Fatal(err)
	}
	if a, b := mustState(t, c, "a").FreeGPUs(), mustState(t, c, "b").FreeGPUs(); a != 0 || b != 0 {
		t.Errorf("after ReserveGang: %d and %d free, want 0 and 0", a, b)
	}
	c.ReleaseGang([]types.UID{"g1", "g2"})
	if a, b := mustState(t, c, "a").FreeGPUs(), mustState(t, c, "b").FreeGPUs(); a != 8 || b != 7 {
		t.Errorf("after ReleaseGang: %d and %d free, want 8 and 7", a, b)
	}
}

// A whole-GPU pod bound to a node where a gang member is planned on a GPU
// for a slice waits until that member is bound: until then only the ledger
// knows the slice's GPU, and the kubelet could give it to the whole-GPU pod.
func TestWholeBindWaitsForPlannedSlices(t *testing.T) {
	node := testbuild.Node("n").GPUs(4, "A100", 40960).Obj()
	member := withPlan(t, testbuild.Pod("s").Shared(10, 50).Obj(), "n", 2)
	whole := testbuild.Pod("w").Whole(2).Obj()
	f := newFixture(t, []*corev1.Node{node}, []*corev1.Pod{member}, member, whole)
	bind := func(p *corev1.Pod) <-chan string {
		done := make(chan string, 1)
		go func() {
			var res extenderv1.ExtenderBindingResult
			f.post(t, verbs.PathBind, &extenderv1.ExtenderBindingArgs{PodNamespace: "default", PodName: p.Name, PodUID: p.UID, Node: "n"}, &res)
			done <- res.Error
		}()
		return done
	}
	wDone := bind(whole)
	select {
	case err := <-wDone:
		t.Fatalf("whole-GPU pod bound (error %q) while a gang member planned on GPU 2 of its node was not", err)
	case <-time.After(200 * time.Millisecond):
	}
	if err := <-bind(member); err != "" {
		t.Fatalf("bind member: %s", err)
	}
	if err := <-wDone; err != "" {
		t.Fatalf("bind whole: %s", err)
	}
	f.pods.mu.Lock()
	calls := append([]string(nil), f.pods.calls...)
	f.pods.mu.Unlock()
	if diff := cmp.Diff([]string{"bind s n", "bind w n"}, calls); diff != "" {
		t.Errorf("API calls (-want +got):\n%s", diff)
	}
}

// A bind waits until the node offers the pod's GPUs: the ledger freed
// GPU 0 when its slice ended, but the node agent still withholds it from
// whole use; the Binding is created once the inventory releases it.
func TestBindWaitsUntilTheNodeOffersTheGPU(t *testing.T) {
	withheld := testbuild.Node("n").GPUs(1, "A100", 40960).WithheldFromWhole(0).Obj()
	whole := testbuild.Pod("w").Whole(1).Obj()
	f := newFixture(t, []*corev1.Node{withheld}, nil, whole)
	done := make(chan string, 1)
	go func() {
		var res extenderv1.ExtenderBindingResult
		f.post(t, verbs.PathBind, &extenderv1.ExtenderBindingArgs{PodNamespace: "default", PodName: "w", PodUID: whole.UID, Node: "n"}, &res)
		done <- res.Error
	}()
	select {
	case err := <-done:
		t.Fatalf("whole-GPU pod bound (error %q) while its node withholds its GPU from whole use", err)
	case <-time.After(200 * time.Millisecond):
	}
	f.cache.SetNode(testbuild.Node("n").GPUs(1, "A100", 40960).Obj())
	select {
	case err := <-done:
		if err != "" {
			t.Fatalf("bind: %s", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("bind still waits after the node released the GPU")
	}
	f.pods.mu.Lock()
	calls := append([]string(nil), f.pods.calls...)
	f.pods.mu.Unlock()
	if diff := cmp.Diff([]string{"bind w n"}, calls); diff != "" {
		t.Errorf("API calls (-want +got):\n%s", diff)
	}
}

// A gang member without a plan passes no node and is not bound, whether
// or not it carries the gate (the webhook may be absent or fail open): no
// member is ever bound alone. Nor is a pod whose gang declaration is
// malformed.
func TestUnplannedGangMemberPassesNoNode(t *testing.T) {
	nodes := []*corev1.Node{testbuild.Node("a").GPUs(8, "A100", 40960).Obj()}
	member := testbuild.Pod("m").Whole(1).Obj()
	member.Annotations[api.AnnotationGang] = "g"
	member.Annotations[api.AnnotationGangMinMember] = "2"
	malformed := testbuild.Pod("bad").Whole(1).Obj()
	malformed.Annotations[api.AnnotationGang] = "g"
	malformed.Annotations[api.AnnotationGangMinMember] = "two"
	// Declarations admission refuses, on pods that got past it (created
	// before, or the webhook not installed): held, never taken as valid
	// nor as plain pods.
	spaced := testbuild.Pod("spaced").Whole(1).Obj()
	spaced.Annotations[api.AnnotationGang] = "g"
	spaced.Annotations[api.AnnotationGangMinMember] = " 2"
	badName := testbuild.Pod("badname").Whole(1).Obj()
	badName.Annotations[api.AnnotationGang] = "Not_A Valid/Name"
	badName.Annotations[api.AnnotationGangMinMember] = "2"
	noGang := testbuild.Pod("nogang").Whole(1).Obj()
	noGang.Annotations[api.AnnotationGangMinMember] = "1"
	f := newFixture(t, nodes, nil, member, malformed, spaced, badName, noGang)
	names := []string{"a"}
	for _, tc := range []struct {
		pod  *corev1.Pod
		want string
	}{
		{member, "gang default/g is placed whole by Tessera's gang planner, and this member is not planned yet"},
		{malformed, "gang-min-member"},
		{spaced, `tessera.dev/gang-min-member=" 2" is not a number of members`},
		{badName, `the gang name "Not_A Valid/Name" (annotation tessera.dev/gang) is not a valid name`},
		{noGang, "annotation tessera.dev/gang-min-member needs a gang"},
	} {
		var res extenderv1.ExtenderFilterResult
		f.post(t, verbs.PathFilter, &extenderv1.ExtenderArgs{Pod: tc.pod, NodeNames: &names}, &res)
		if res.NodeNames == nil || len(*res.NodeNames) != 0 {
			t.Errorf("%s: filter passed %v, want no node", tc.pod.Name, res.NodeNames)
		}
		if msg := res.FailedNodes["a"]; !strings.Contains(msg, tc.want) {
			t.Errorf("%s: reason %q, want it to say %q", tc.pod.Name, msg, tc.want)
		}
		var br extenderv1.ExtenderBindingResult
		f.post(t, verbs.PathBind, &extenderv1.ExtenderBindingArgs{PodName: tc.pod.Name, PodNamespace: tc.pod.Namespace, PodUID: tc.pod.UID, Node: "a"}, &br)
		if !strings.Contains(br.Error, tc.want) {
			t.Errorf("%s: bind answered %q, want a refusal saying %q", tc.pod.Name, br.Error, tc.want)
		}
	}
}

// A node where members planned by count (a reservation's, or a plan naming
// no GPUs) wait for more whole GPUs than are free is kept for them: no new
// slice starts there, not even beside a running slice; once enough GPUs
// are free, slices go beside others again, not onto the free GPUs. A plan
// that names its GPUs keeps only those.
func TestNodeKeptForPlannedWholeGPUs(t *testing.T) {
	node := testbuild.Node("n1").GPUs(2, "A100", 40960).Obj()
	s0 := testbuild.Pod("s0").Shared(10, 20).Node("n1").On(0, 10240, 20).Obj()
	s1 := testbuild.Pod("s1").Shared(10, 20).Node("n1").On(1, 10240, 20).Obj()
	member := withPlan(t, testbuild.Pod("m").Whole(1).Obj(), "n1", -1)
	cache := newTestCache(t, []*corev1.Node{node}, []*corev1.Pod{s0, s1, member})
	slice, err := ParseDemand(testbuild.Pod("new").Shared(10, 20).Obj())
	if err != nil {
		t.Fatal(err)
	}
	v := Filter(mustState(t, cache, "n1"), &slice)
	if v.Reason != KeptForWholeGPUs || !strings.Contains(v.Message, "kept for pods planned there that need empty GPUs") {
		t.Errorf("both GPUs in use, one whole GPU planned: %+v, want %s", v, KeptForWholeGPUs)
	}
	// The planned member's own view (its bind, a backfill the reservation
	// admits) is not kept.
	if r := Check(mustState(t, cache, "n1").without(map[types.UID]bool{member.UID: true}), &slice); r != Fits {
		t.Errorf("without the planned member: %s, want it to fit", r)
	}
	cache.DeletePod(s1.UID)
	st := mustState(t, cache, "n1")
	if r := Check(st, &slice); r != Fits {
		t.Errorf("GPU 1 free for the member: %s, want the slice to fit beside s0", r)
	}
	u, err := ChoosePlacement(testPolicy(t, PolicyBinpack), st, "new", &slice)
	if err != nil || len(u.Shared) != 1 || u.Shared[0].Index != 0 {
		t.Errorf("placement %+v, %v: want GPU 0, beside s0", u, err)
	}

	// Named: only GPU 1 is held, and a slice fits GPU 0 at once.
	named := testbuild.Pod("m").Whole(1).Obj()
	plan := api.GangPlan{Gang: "g", Node: "n1", Expires: time.Now().Add(time.Hour), GPUs: []api.GPURef{{UUID: testbuild.GPUUUID("n1", 1), Index: 1}}}
	ann, err := testbuild.Sealer(t).GangPlanAnnotations(named.UID, plan)
	if err != nil {
		t.Fatal(err)
	}
	maps.Copy(named.Annotations, ann)
	cache = newTestCache(t, []*corev1.Node{node}, []*corev1.Pod{s0, s1, named})
	st = mustState(t, cache, "n1")
	u, err = ChoosePlacement(testPolicy(t, PolicyBinpack), st, "new", &slice)
	if err != nil || len(u.Shared) != 1 || u.Shared[0].Index != 0 {
		t.Errorf("plan naming GPU 1: placement %+v, %v; want GPU 0", u, err)
	}
	cache.DeletePod(s0.UID)
	cache.DeletePod(s1.UID)
	if got := freeOf(mustState(t, cache, "n1")); got != "1000/40960 0/0" {
		t.Errorf("free view %q: want GPU 0 free and GPU 1 held", got)
	}
}

// A whole-GPU bind waits for the slices planned on its node only while
// their binds could place them: a slice whose planned GPU is taken, or
// gone from the node, is refused by its own bind until its plan expires,
// and held every whole-GPU bind of the node meanwhile ("waiting for gang
// members planned on shared GPUs of a100-2 to be bound", then the
// scheduler's Client.Timeout, on make demo).
func TestWholeBindWaitsOnlyForBindablePlannedSlices(t *testing.T) {
	gone := withPlan(t, testbuild.Pod("s").Shared(10, 50).Obj(), "n", 0)
	gone.Annotations[api.AnnotationGangPlan] = strings.Replace(gone.Annotations[api.AnnotationGangPlan], testbuild.GPUUUID("n", 0), testbuild.GPUUUID("other", 0), 1)
	gone = resealed(t, gone)
	for _, tc := range []struct {
		name   string
		bound  []*corev1.Pod
		member *corev1.Pod
		waits  bool
	}{
		{name: "its GPU has room", member: withPlan(t, testbuild.Pod("s").Shared(10, 50).Obj(), "n", 2), waits: true},
		{name: "its GPU is taken whole", member: withPlan(t, testbuild.Pod("s").Shared(10, 50).Obj(), "n", 2),
			bound: []*corev1.Pod{testbuild.Pod("w2").Whole(1).Node("n").Holding(2).Obj()}},
		{name: "its GPU is full", member: withPlan(t, testbuild.Pod("s").Shared(10, 50).Obj(), "n", 2),
			bound: []*corev1.Pod{testbuild.Pod("big").Shared(35, 50).Node("n").On(2, 35840, 50).Obj()}},
		{name: "its GPU left the node", member: gone},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node := testbuild.Node("n").GPUs(4, "A100", 40960).Obj()
			whole := testbuild.Pod("w").Whole(1).Obj()
			f := newFixture(t, []*corev1.Node{node}, append([]*corev1.Pod{tc.member}, tc.bound...), tc.member, whole)
			done := make(chan string, 1)
			go func() {
				var res extenderv1.ExtenderBindingResult
				f.post(t, verbs.PathBind, &extenderv1.ExtenderBindingArgs{PodNamespace: "default", PodName: "w", PodUID: whole.UID, Node: "n"}, &res)
				done <- res.Error
			}()
			wait := 5 * time.Second
			if tc.waits {
				wait = 300 * time.Millisecond
			}
			select {
			case err := <-done:
				if tc.waits {
					t.Fatalf("whole-GPU pod bound (error %q) while a slice planned on a GPU of its node with room was not", err)
				}
				if err != "" {
					t.Fatalf("bind whole: %s", err)
				}
			case <-time.After(wait):
				if !tc.waits {
					t.Fatalf("the whole-GPU bind still waits after %v for a planned slice whose bind would be refused", wait)
				}
				// The member binds; then the whole-GPU pod does.
				var res extenderv1.ExtenderBindingResult
				f.post(t, verbs.PathBind, &extenderv1.ExtenderBindingArgs{PodNamespace: "default", PodName: "s", PodUID: tc.member.UID, Node: "n"}, &res)
				if res.Error != "" {
					t.Fatalf("bind member: %s", res.Error)
				}
				if err := <-done; err != "" {
					t.Fatalf("bind whole: %s", err)
				}
			}
		})
	}
}

// resealed is pod with its plan annotation sealed again (after a test
// changed it).
func resealed(t *testing.T, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	plan, err := api.ParseGangPlan(pod.Annotations[api.AnnotationGangPlan])
	if err != nil {
		t.Fatal(err)
	}
	ann, err := testbuild.Sealer(t).GangPlanAnnotations(pod.UID, *plan)
	if err != nil {
		t.Fatal(err)
	}
	p := pod.DeepCopy()
	for k, v := range ann {
		p.Annotations[k] = v
	}
	return p
}
