package queue

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/tessera-gpu/tessera/allocator/quota"
)

func TestReclaim(t *testing.T) {
	tests := []struct {
		name     string
		tree     *Tree
		used     map[string]int64
		pending  map[string]int64
		capacity int64 // 16 when 0
		queue    string
		req      quota.Resources
		running  []Workload
		enough   func([]Workload) bool // freed(req) when nil
		want     []string
		wantErr  string
	}{
		{
			name: "a team takes back its guarantee from the other department's borrower, newest first",
			tree: departments(), used: map[string]int64{"a1": 12, "a2": 4}, queue: "b1", req: gpus(4),
			running: []Workload{wl("a1", "old", 0, time.Hour, 4), wl("a1", "mid", 0, 30*time.Minute, 4), wl("a1", "new", 0, time.Minute, 4), wl("a2", "x", 0, 0, 4)},
			want:    []string{"a1/new"},
		},
		{
			name: "the work of a queue that admits nothing is never taken",
			// bad claims a's namespace too: both are invalid, and the
			// namespace's pods count under bad (QueueOf's first by name).
			tree: Build([]Spec{q("a", "", 8, "ns-a"), q("b", "", 8, "ns-b"), q("bad", "", 0, "ns-a")}), capacity: 8,
			used: map[string]int64{"bad": 8}, queue: "b", req: gpus(4),
			running: []Workload{wl("bad", "w1", 0, time.Hour, 4), wl("bad", "w2", 0, time.Minute, 4)},
			wantErr: "none runs evictable work now",
		},
		{
			name: "never below a team's guarantee",
			tree: departments(), used: map[string]int64{"a1": 12, "a2": 4}, queue: "b1", req: gpus(4),
			// a1's one workload would leave it at 0, a2's too.
			running: []Workload{wl("a1", "all", 0, time.Hour, 12), wl("a2", "x", 0, 0, 4)},
			wantErr: "other queues borrow too little to free tessera.dev/gpu=4 without falling below their own guarantees",
		},
		{
			name: "never below a department's guarantee, though the team borrows",
			// a1 borrows a2's idle guarantee; dept-a uses exactly its 8.
			tree: departments(), used: map[string]int64{"a1": 8}, queue: "b1", req: gpus(4),
			running: []Workload{wl("a1", "w1", 0, time.Hour, 4), wl("a1", "w2", 0, time.Minute, 4)},
			wantErr: "borrow too little",
		},
		{
			name: "an elastic gang's extra member straddling its queue's guarantee goes to a queue further below its own",
			// a borrows 2 through its gang's 4-GPU extra member; b is 4
			// short.
			tree: Build([]Spec{q("a", "", 6), q("b", "", 8)}), capacity: 12,
			used: map[string]int64{"a": 8, "b": 4}, queue: "b", req: gpus(4),
			running: []Workload{wl("a", "gang", 0, time.Hour, 4), extra(wl("a", "gang member x", 0, time.Minute, 4))},
			want:    []string{"a/gang member x"},
		},
		{
			name: "a whole workload straddling its queue's guarantee is not taken",
			tree: Build([]Spec{q("a", "", 6), q("b", "", 8)}), capacity: 12,
			used: map[string]int64{"a": 8, "b": 4}, queue: "b", req: gpus(4),
			running: []Workload{wl("a", "old", 0, time.Hour, 4), wl("a", "new", 0, time.Minute, 4)},
			wantErr: "borrow too little",
		},
		{
			name: "a straddling extra member is not taken when it leaves its queue as short as the asker",
			// a would be 2 short, as b is now: nothing gained.
			tree: Build([]Spec{q("a", "", 6), q("b", "", 8)}), capacity: 12,
			used: map[string]int64{"a": 8, "b": 6}, queue: "b", req: gpus(2),
			running: []Workload{wl("a", "gang", 0, time.Hour, 4), extra(wl("a", "gang member x", 0, time.Minute, 4))},
			wantErr: "borrow too little",
		},
		{
			name: "victims that keep every guarantee before an extra member that straddles",
			// a's extra member comes first (extras before whole
			// workloads) but would put a below its guarantee; c's
			// workload keeps every guarantee.
			tree: Build([]Spec{q("a", "", 6), q("b", "", 8), q("c", "", 0)}), capacity: 16,
			used: map[string]int64{"a": 8, "b": 4, "c": 4}, queue: "b", req: gpus(4),
			running: []Workload{wl("a", "gang", 0, time.Hour, 4), extra(wl("a", "gang member x", 0, time.Minute, 4)), wl("c", "w", 0, time.Minute, 4)},
			want:    []string{"c/w"},
		},
		{
			name: "a queue at its guarantee gives no extra member that straddles it",
			tree: Build([]Spec{q("a", "", 8), q("b", "", 8)}), capacity: 12,
			used: map[string]int64{"a": 8, "b": 4}, queue: "b", req: gpus(4),
			running: []Workload{wl("a", "gang", 0, time.Hour, 4), extra(wl("a", "gang member x", 0, time.Minute, 4))},
			wantErr: "borrow too little",
		},
		{
			name: "a straddling extra member under a common parent below its guarantee",
			// dept uses 14 of its 16 (two GPUs idle); the request gives
			// it back the 4 the victim takes.
			tree:     Build([]Spec{q("dept", "", 16), q("a", "dept", 6), q("b", "dept", 10)}),
			capacity: 16, used: map[string]int64{"a": 8, "b": 6}, queue: "b", req: gpus(4),
			running: []Workload{wl("a", "gang", 0, time.Hour, 4), extra(wl("a", "gang member x", 0, time.Minute, 4))},
			want:    []string{"a/gang member x"},
		},
		{
			name: "a common parent's guarantee does not hold a transfer between its children",
			// The extra member takes 4 from dept for a request of 2:
			// dept falls from 14 to 12 of its 16, but the room moves
			// between its own children, none of it to another
			// department, and a keeps its guarantee.
			tree:     Build([]Spec{q("dept", "", 16), q("a", "dept", 2), q("b", "dept", 9)}),
			capacity: 16, used: map[string]int64{"a": 8, "b": 6}, queue: "b", req: gpus(2),
			running: []Workload{wl("a", "gang", 0, time.Hour, 4), extra(wl("a", "gang member x", 0, time.Minute, 4))},
			enough:  freed(4),
			want:    []string{"a/gang member x"},
		},
		{
			// A tenant guaranteed 2 borrows 14 through one 16-GPU gang;
			// the queue guaranteed 12, using 4, is 8 short. Taking the
			// gang leaves its queue 2 short, less than 8, and the gang
			// borrows more (14) than that.
			name: "a whole workload mostly borrowed goes to a queue further below its guarantee",
			tree: Build([]Spec{q("qe", "", 2), q("qv", "", 12)}), capacity: 20,
			used: map[string]int64{"qe": 16, "qv": 4}, queue: "qv", req: gpus(4),
			running: []Workload{wl("qe", "gang", 0, time.Hour, 16)},
			want:    []string{"qe/gang"},
		},
		{
			name: "a whole workload half within its queue's guarantee is kept",
			// a's one 16-GPU workload: 8 within its guarantee, 8
			// borrowed; taking it leaves a 8 short, as b is.
			tree: Build([]Spec{q("a", "", 8), q("b", "", 8)}), capacity: 16,
			used: map[string]int64{"a": 16}, queue: "b", req: gpus(8),
			running: []Workload{wl("a", "big", 0, time.Hour, 16)},
			wantErr: "borrow too little",
		},
		{
			name: "a whole workload that borrows no more than it leaves short is kept",
			// a guaranteed 6 uses 10 in one workload: it borrows 4 and
			// would be 6 short; b is 8 short.
			tree: Build([]Spec{q("a", "", 6), q("b", "", 10)}), capacity: 12,
			used: map[string]int64{"a": 10, "b": 2}, queue: "b", req: gpus(2),
			running: []Workload{wl("a", "w", 0, time.Hour, 10)},
			wantErr: "borrow too little",
		},
		{
			name: "within one department a team takes back its guarantee from its sibling",
			tree: departments(), used: map[string]int64{"a1": 8, "b1": 4, "b2": 4}, queue: "a2", req: gpus(4),
			running: []Workload{wl("a1", "w1", 0, time.Hour, 4), wl("a1", "w2", 0, time.Minute, 4), wl("b1", "x", -10, 0, 4)},
			want:    []string{"a1/w2"},
		},
		{
			name: "lowest priority before the queue furthest above its fair share",
			// Fair shares: a 3, b 5, c 4; b is further above.
			tree: Build([]Spec{q("a", "", 0), q("b", "", 2), q("c", "", 4)}), capacity: 12,
			used: map[string]int64{"a": 4, "b": 8}, pending: map[string]int64{"c": 4}, queue: "c", req: gpus(4),
			running: []Workload{wl("b", "b1", 0, time.Minute, 4), wl("b", "b2", 0, time.Hour, 4), wl("a", "a-low", -1, time.Hour, 4)},
			want:    []string{"a/a-low"},
		},
		{
			name: "the queue furthest above its fair share before newest",
			tree: Build([]Spec{q("a", "", 0), q("b", "", 2), q("c", "", 4)}), capacity: 12,
			used: map[string]int64{"a": 4, "b": 8}, pending: map[string]int64{"c": 4}, queue: "c", req: gpus(4),
			running: []Workload{wl("a", "a-new", 0, time.Minute, 4), wl("b", "b-old", 0, time.Hour, 4)},
			want:    []string{"b/b-old"},
		},
		{
			name: "not preemptible, not taken",
			tree: departments(), used: map[string]int64{"a1": 12, "a2": 4}, queue: "b1", req: gpus(4),
			running: []Workload{wl("a1", "old", 0, time.Hour, 4), func() Workload { w := wl("a1", "new", 0, time.Minute, 4); w.Preemptible = false; return w }()},
			want:    []string{"a1/old"},
		},
		{
			name: "the asker's own work is no victim",
			tree: Build([]Spec{q("a", "", 0), q("b", "", 8)}), used: map[string]int64{"a": 8, "b": 4}, queue: "b", req: gpus(4),
			running: []Workload{wl("b", "mine", -5, time.Minute, 4)},
			wantErr: "no workload of another queue may be taken back to free tessera.dev/gpu=4: none runs evictable work now",
		},
		{
			name: "above guarantee and fair share: nothing reclaimed",
			tree: departments(), used: map[string]int64{"a1": 12, "b1": 4}, queue: "b1", req: gpus(4),
			running: []Workload{wl("a1", "w", 0, 0, 4)},
			wantErr: "queue b1 would use 8 tessera.dev/gpu, above its guarantee 4, and 8 tessera.dev/gpu is above its fair share 4: only guarantees and fair shares are reclaimed",
		},
		{
			name: "up to its fair share beyond its guarantee",
			tree: Build([]Spec{q("a", "", 0), q("b", "", 0)}), used: map[string]int64{"a": 16}, pending: map[string]int64{"b": 8}, queue: "b", req: gpus(8),
			running: []Workload{wl("a", "w1", 0, time.Hour, 8), wl("a", "w2", 0, time.Minute, 8)},
			want:    []string{"a/w2"},
		},
		{
			name: "a fair share is not taken below the victim's",
			// a's fair share 8, b's 8: taking a 12-GPU workload would
			// leave a at 4 while b would be at 8.
			tree: Build([]Spec{q("a", "", 0), q("b", "", 0)}), used: map[string]int64{"a": 16}, pending: map[string]int64{"b": 8}, queue: "b", req: gpus(8),
			running: []Workload{wl("a", "w1", 0, time.Hour, 4), wl("a", "w2", 0, time.Minute, 12)},
			enough:  freed(8),
			wantErr: "borrow too little",
		},
		{
			name: "an invalid asker reclaims nothing",
			tree: Build([]Spec{q("a", "", 8), q("b", "", 8).limit(4)}), used: map[string]int64{"a": 16}, queue: "b", req: gpus(4),
			running: []Workload{wl("a", "w", 0, 0, 8)},
			wantErr: "queue b admits nothing until it is fixed",
		},
		{
			name: "beyond the asker's limit, nothing",
			tree: Build([]Spec{q("a", "", 0), q("b", "", 8).limit(8)}), used: map[string]int64{"a": 12, "b": 6}, queue: "b", req: gpus(4),
			running: []Workload{wl("a", "w", 0, 0, 8)},
			wantErr: "queue b would use 10 tessera.dev/gpu, above its limit 8",
		},
		{
			name: "unknown asker",
			tree: departments(), queue: "nope", req: gpus(1),
			wantErr: "queue nope is not defined",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			enough := tc.enough
			if enough == nil {
				enough = freed(tc.req[gpu])
			}
			s := state(tc.tree, tc.used, tc.pending)
			if tc.capacity != 0 {
				s.Capacity = gpus(tc.capacity)
			}
			victims, err := s.Reclaim(tc.queue, tc.req, tc.running, enough)
			if tc.wantErr != "" {
				var re *ReclaimError
				if !errors.As(err, &re) || re.Queue != tc.queue || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Reclaim = %v, %v; want a ReclaimError containing %q", keys(victims), err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, keys(victims)); diff != "" {
				t.Errorf("victims (-want +got):\n%s", diff)
			}
		})
	}
}

// Reclaim never takes a queue, or any of its ancestors, below its
// guarantee, however the work is cut (but for a queue above its guarantee
// that an extra member takes below it, by less than the asker is short of
// its own; the workloads here are whole).
func TestReclaimKeepsEveryGuarantee(t *testing.T) {
	tree := departments()
	reclaimed := 0
	for n := int64(1); n <= 8; n++ {
		var running []Workload
		used := map[string]int64{}
		for i, queue := range []string{"a1", "a1", "a2", "a1", "b2", "a1", "a2", "b2"} {
			w := wl(queue, string(rune('a'+i)), int32(i%3), time.Duration(i)*time.Minute, 1+int64(i)%3)
			running = append(running, w)
			used[queue] += w.Uses[gpu]
		}
		s := state(tree, used, nil)
		victims, err := s.Reclaim("b1", gpus(n), running, freed(n))
		if err != nil {
			continue
		}
		reclaimed++
		left := map[string]int64{}
		for _, name := range tree.Names() {
			left[name] = s.view().used[name][gpu]
		}
		for _, v := range victims {
			for _, p := range tree.Path(v.Queue) {
				left[p] -= v.Uses[gpu]
			}
		}
		for _, p := range tree.Path("b1") {
			left[p] += n
		}
		for _, name := range tree.Names() {
			g := s.Tree.nodes[name].spec.Guaranteed[gpu]
			if left[name] < g && left[name] < s.view().used[name][gpu] {
				t.Errorf("request %d: victims %v put %s at %d, below its guarantee %d", n, keys(victims), name, left[name], g)
			}
		}
	}
	if reclaimed == 0 {
		t.Error("no request was reclaimed for: the test checks nothing")
	}
}

// The greedy prefix may take small workloads that turn out not to be
// needed once a big one is taken: they are given back.
func TestReclaimMinimal(t *testing.T) {
	s := state(Build([]Spec{q("a", "", 0), q("b", "", 8)}), map[string]int64{"a": 16}, nil)
	running := []Workload{
		wl("a", "small-newest", 0, time.Minute, 1),
		wl("a", "small-newer", 0, 2*time.Minute, 1),
		wl("a", "big", 0, time.Hour, 6),
		wl("a", "older", 0, 2*time.Hour, 8),
	}
	var calls int
	enough := func(v []Workload) bool { calls++; return freed(6)(v) }
	victims, err := s.Reclaim("b", gpus(6), running, enough)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"a/big"}, keys(victims)); diff != "" {
		t.Errorf("victims (-want +got):\n%s", diff)
	}
	// Greedy: nil, 1, 2, 3 victims; backward: two tries.
	if calls != 6 {
		t.Errorf("enough called %d times, want 6", calls)
	}
}

func TestReclaimNeedsNothingWhenRoomExists(t *testing.T) {
	s := state(departments(), map[string]int64{"a1": 8}, nil)
	victims, err := s.Reclaim("b1", gpus(4), []Workload{wl("a1", "w", 0, 0, 4)}, func([]Workload) bool { return true })
	if err != nil || len(victims) != 0 {
		t.Fatalf("Reclaim = %v, %v; want no victims", keys(victims), err)
	}
}

func TestCanPreempt(t *testing.T) {
	s := state(departments(), map[string]int64{"a1": 8, "a2": 2, "b1": 4}, nil)
	pinned := wl("a1", "pinned", 0, 0, 2)
	pinned.Preemptible = false
	tests := []struct {
		name    string
		asker   string
		req     quota.Resources
		victim  Workload
		want    bool
		wantMsg string
	}{
		{"same queue", "a1", gpus(8), wl("a1", "w", 0, 0, 8), true, "same queue"},
		{"victim's team and department stay at their guarantees", "b2", gpus(2), wl("a1", "w", 0, 0, 2), true, "queue a1 stays at or above its guarantee"},
		{"victim's department would fall below", "b2", gpus(4), wl("a1", "w", 0, 0, 4), false, "evicting a1/w would put queue dept-a at 6 tessera.dev/gpu, below its guarantee 8"},
		{"victim's team would fall below", "b2", gpus(2), wl("b1", "w", 0, 0, 2), false, "evicting b1/w would put queue b1 at 2 tessera.dev/gpu, below its guarantee 4"},
		{"a sibling's use counts the request on the common department", "a2", gpus(4), wl("a1", "w", 0, 0, 4), true, "queue a1 stays at or above its guarantee"},
		{"not preemptible", "a1", gpus(2), pinned, false, "a1/pinned may not be evicted now"},
		{"unknown asker", "nope", gpus(2), wl("a1", "w", 0, 0, 2), false, "queue nope is not defined"},
		{"victim outside any queue", "b1", gpus(2), wl("elsewhere", "w", 0, 0, 2), true, "queue elsewhere is not defined"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, why := s.CanPreempt(tc.asker, tc.req, tc.victim)
			if got != tc.want || !strings.Contains(why, tc.wantMsg) {
				t.Errorf("CanPreempt = %v (%s), want %v (%s)", got, why, tc.want, tc.wantMsg)
			}
		})
	}
}

// Topology: the asker needs one of two 4-GPU cliques whole, and queue b,
// guaranteed 4, runs a 1-GPU workload on each of the 8 GPUs, the newest
// alternating between the cliques. Taken in order, b's 4 GPUs of surplus
// would go to two workloads of each clique, which frees no clique; the
// workloads of the clique that cannot be freed are passed over, and the
// four of one clique are taken.
func TestReclaimSpendsNoSurplusOnTheOtherClique(t *testing.T) {
	s := state(Build([]Spec{q("a", "", 4), q("b", "", 4)}), map[string]int64{"b": 8}, nil)
	s.Capacity = gpus(8)
	clique := map[string]int{}
	var running []Workload
	for i, g := range []int{0, 4, 1, 5, 2, 3, 6, 7} {
		w := wl("b", fmt.Sprintf("gpu%d", g), 0, time.Duration(i+1)*time.Minute, 1)
		clique[w.Key] = g / 4
		running = append(running, w)
	}
	oneClique := func(v []Workload) bool {
		var n [2]int
		for _, w := range v {
			n[clique[w.Key]]++
		}
		return n[0] == 4 || n[1] == 4
	}
	victims, err := s.Reclaim("a", gpus(4), running, oneClique)
	if err != nil {
		t.Fatal(err)
	}
	if !oneClique(victims) || len(victims) != 4 {
		t.Errorf("victims %v, want the four workloads of one clique", keys(victims))
	}
	// Without the topology (any 4 GPUs), the four newest go.
	victims, err = s.Reclaim("a", gpus(4), running, freed(4))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"b/gpu0", "b/gpu4", "b/gpu1", "b/gpu5"}, keys(victims)); diff != "" {
		t.Errorf("victims (-want +got):\n%s", diff)
	}
}

// A slice's queue, within its guarantee of GPU memory, reclaims from a
// queue borrowing whole GPUs: a whole GPU freed serves the slice. Only
// workloads using the asker's own resources were candidates, so on make
// demo an inference queue's slices waited for ever ("other queues borrow
// too little to free tessera.dev/gpu-memory=20") while a training queue
// borrowed every GPU whole.
func TestReclaimAcrossShapes(t *testing.T) {
	tree := Build([]Spec{q("train", "", 4), {Name: "infer", Guaranteed: quota.Resources{gpu: 12, mem: 400}}})
	s := state(tree, map[string]int64{"train": 16}, nil)
	s.Capacity[mem] = 640
	running := []Workload{wl("train", "old", 0, time.Hour, 1), wl("train", "new", 0, time.Minute, 1)}
	// The callback plans the slice: one whole GPU freed is enough.
	enough := func(v []Workload) bool { return len(v) >= 1 }
	victims, err := s.Reclaim("infer", quota.Resources{mem: 20}, running, enough)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"train/new"}, keys(victims)); diff != "" {
		t.Errorf("victims (-want +got):\n%s", diff)
	}
}

// The same under a department that guarantees the whole cluster's GPUs,
// all in use by its training team's whole-GPU pods (the tester's layout on
// make demo: top guarantees 20 GPUs and 400 memory units; qtrain 8 GPUs,
// running 20; qinf 80 units): a whole GPU freed for the slice lowers top's
// whole GPUs below its guarantee, but the room stays in top (the slice uses
// that GPU), so top's guarantee is not the victim's. It refused with
// "other queues borrow too little".
func TestReclaimAcrossShapesUnderAGuaranteeingParent(t *testing.T) {
	tree := Build([]Spec{
		{Name: "top", Guaranteed: quota.Resources{gpu: 20, mem: 400}},
		q("qtrain", "top", 8).limit(20),
		{Name: "qinf", Parent: "top", Guaranteed: quota.Resources{mem: 80}},
	})
	s := state(tree, map[string]int64{"qtrain": 20}, nil)
	s.Capacity = quota.Resources{gpu: 20, mem: 400}
	running := []Workload{wl("qtrain", "old", 0, time.Hour, 1), wl("qtrain", "new", 0, time.Minute, 1)}
	enough := func(v []Workload) bool { return len(v) >= 1 }
	victims, err := s.Reclaim("qinf", quota.Resources{mem: 20}, running, enough)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"qtrain/new"}, keys(victims)); diff != "" {
		t.Errorf("victims (-want +got):\n%s", diff)
	}
	// Another department's queue is held to top's guarantee still.
	tree = Build([]Spec{
		{Name: "top", Guaranteed: quota.Resources{gpu: 20, mem: 400}},
		q("qtrain", "top", 8).limit(20),
		{Name: "other", Guaranteed: quota.Resources{mem: 80}},
	})
	s = state(tree, map[string]int64{"qtrain": 20}, nil)
	s.Capacity = quota.Resources{gpu: 20, mem: 480}
	if victims, err := s.Reclaim("other", quota.Resources{mem: 20}, running, enough); err == nil {
		t.Errorf("another department took %v below top's guarantee", keys(victims))
	}
}

// Beyond its guarantee (it guarantees no GPU cores) but within its fair
// share, a slice's queue reclaims from a queue borrowing whole GPUs above
// its fair share: the two are compared by their dominant resources, not in
// the slice's resources alone (where the whole-GPU queue would always
// stand at 0).
func TestReclaimAcrossShapesForAFairShare(t *testing.T) {
	const core corev1.ResourceName = "tessera.dev/gpu-core"
	tree := Build([]Spec{q("train", "", 4), {Name: "infer", Guaranteed: quota.Resources{gpu: 12, mem: 400}}})
	s := state(tree, map[string]int64{"train": 16}, nil)
	s.Capacity[mem], s.Capacity[core] = 640, 1600
	s.Pending["infer"] = quota.Resources{mem: 80, core: 120}
	running := []Workload{wl("train", "old", 0, time.Hour, 1), wl("train", "new", 0, time.Minute, 1)}
	enough := func(v []Workload) bool { return len(v) >= 1 }
	victims, err := s.Reclaim("infer", quota.Resources{mem: 20, core: 30}, running, enough)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"train/new"}, keys(victims)); diff != "" {
		t.Errorf("victims (-want +got):\n%s", diff)
	}
}

// A queue above its guarantee but within its fair share, on a cluster the
// queues fill, is admitted and takes back what a sibling uses beyond its
// own fair share, in whole GPUs (the demo's case: team-a guaranteed 8 runs
// 8 and asks 4 more, fair share 12; team-b guaranteed 4 runs 20 one-GPU
// pods, fair share 16). Admit refused it ("the queues would use 32 of the
// cluster's 28") before reclaim was reached, so a fair share of whole GPUs
// was never taken back; reclaim of slices' cores was (the test above).
func TestFairShareOfWholeGPUsOnAFullCluster(t *testing.T) {
	tree := Build([]Spec{q("org", "", 28), q("team-a", "org", 8, "a"), q("team-b", "org", 4, "b")})
	s := state(tree, map[string]int64{"team-a": 8, "team-b": 20}, map[string]int64{"team-a": 4})
	s.Capacity = gpus(28)
	if got := s.FairShare(); got["team-a"][gpu] != 12 || got["team-b"][gpu] != 16 {
		t.Fatalf("fair shares a %d, b %d; want 12 and 16", got["team-a"][gpu], got["team-b"][gpu])
	}
	d := s.Admit("team-a", gpus(4))
	if !d.Allowed || !d.Borrowing {
		t.Fatalf("Admit = %+v, want allowed, borrowing", d)
	}
	var running []Workload
	for i := range 20 {
		running = append(running, wl("team-b", fmt.Sprintf("b-%02d", i), 0, time.Duration(20-i)*time.Minute, 1))
	}
	victims, err := s.Reclaim("team-a", gpus(4), running, freed(4))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"team-b/b-19", "team-b/b-18", "team-b/b-17", "team-b/b-16"}, keys(victims)); diff != "" {
		t.Errorf("victims, the newest of team-b (-want +got):\n%s", diff)
	}
	// Beyond its fair share it is refused, as before: 8 more would take
	// team-a to 16 of its 12.
	if d := s.Admit("team-a", gpus(8)); d.Allowed {
		t.Errorf("Admit of 8 = %+v, want refused above the fair share on a full cluster", d)
	}
}

// Reclaim for a fair share counts recent use as the queue order does: two
// teams guaranteed 2 each on 28 GPUs, team-a with 6 GPUs of history; the
// order gave team-b 17 and team-a 11 (their shares, history included, are
// then equal), and team-a, below its fair share of 14 by current use
// alone, may not take that back (e2e TestQueuesFairShareByHistory: with
// current use alone it did, and both teams ended at 14). Without history
// the same split is taken back to 14 each.
func TestReclaimForAFairShareCountsHistory(t *testing.T) {
	for _, tc := range []struct {
		name    string
		history float64 // team-a's, in GPUs used lately
		want    []string
	}{
		{name: "history", history: 6},
		{name: "none", want: []string{"team-b/b-16", "team-b/b-15", "team-b/b-14"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tree := Build([]Spec{q("team-a", "", 2, "a"), q("team-b", "", 2, "b")})
			s := state(tree, map[string]int64{"team-a": 11, "team-b": 17}, map[string]int64{"team-a": 17, "team-b": 11})
			s.Capacity, s.HalfLife = gpus(28), halfLife
			s.Usage = map[string]Usage{"team-a": {gpu: tc.history * steadyState(halfLife)}}
			if fs := s.FairShare(); fs["team-a"][gpu] != 14 || fs["team-b"][gpu] != 14 {
				t.Fatalf("fair shares %v, want 14 each", fs)
			}
			if d := s.Admit("team-a", gpus(3)); !d.Allowed {
				t.Fatalf("Admit = %+v, want allowed within the fair share", d)
			}
			var running []Workload
			for i := range 17 {
				running = append(running, wl("team-b", fmt.Sprintf("b-%02d", i), 0, time.Duration(17-i)*time.Minute, 1))
			}
			victims, err := s.Reclaim("team-a", gpus(3), running, freed(3))
			if tc.want == nil {
				if err == nil {
					t.Errorf("Reclaim took %v from team-b, want nothing: team-a's history evens the shares", keys(victims))
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, keys(victims)); diff != "" {
				t.Errorf("victims (-want +got):\n%s", diff)
			}
		})
	}
}
