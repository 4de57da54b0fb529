package queue

import (
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestBuild(t *testing.T) {
	deep := []Spec{q("l1", "", 0)}
	for i := 2; i <= MaxDepth+1; i++ {
		deep = append(deep, q(fmt.Sprintf("l%d", i), fmt.Sprintf("l%d", i-1), 0))
	}
	tests := []struct {
		name  string
		specs []Spec
		// invalid maps queues to a part of their reason; every other
		// queue must be valid.
		invalid map[string]string
		warn    string
	}{
		{name: "department and teams", specs: departments().specs()},
		{
			name:    "unknown parent",
			specs:   []Spec{q("team", "nope", 1)},
			invalid: map[string]string{"team": "queue team's parent nope is not defined"},
		},
		{
			name:  "cycle, and a queue under it",
			specs: []Spec{q("a", "b", 0), q("b", "a", 0), q("c", "a", 0)},
			invalid: map[string]string{
				"a": "queue a is on a parent cycle a → b → a",
				"b": "queue b is on a parent cycle a → b → a",
				"c": "queue c is under invalid queue a",
			},
		},
		{
			name:    "own parent",
			specs:   []Spec{q("a", "a", 0)},
			invalid: map[string]string{"a": "parent cycle a → a"},
		},
		{
			name:    "deeper than 8 levels",
			specs:   deep,
			invalid: map[string]string{"l9": "queue l9 is 9 levels deep (l1/l2/l3/l4/l5/l6/l7/l8/l9), deeper than 8"},
		},
		{
			name:  "a namespace claimed twice",
			specs: []Spec{q("a", "", 0, "shared"), q("b", "", 0, "shared", "own"), q("c", "", 0, "c")},
			invalid: map[string]string{
				"a": "namespace shared is claimed by queues a, b",
				"b": "namespace shared is claimed by queues a, b",
			},
		},
		{
			name:  "children guarantee above their parent's limit",
			specs: []Spec{q("d", "", 4).limit(6), q("t1", "d", 4), q("t2", "d", 4)},
			invalid: map[string]string{
				"t1": "the guarantees of d's children sum to 8 tessera.dev/gpu, above d's limit 6",
				"t2": "the guarantees of d's children sum to 8 tessera.dev/gpu, above d's limit 6",
			},
		},
		{
			name:  "children guarantee above their parent's guarantee only warn",
			specs: []Spec{q("d", "", 4), q("t1", "d", 4), q("t2", "d", 4)},
			warn:  "the guarantees of d's children sum to 8 tessera.dev/gpu, above d's guarantee 4",
		},
		{
			name:    "defined twice",
			specs:   []Spec{q("a", "", 1), q("a", "", 2)},
			invalid: map[string]string{"a": "queue a is defined more than once"},
		},
		{
			name:    "guarantee above its own limit",
			specs:   []Spec{q("a", "", 4).limit(2)},
			invalid: map[string]string{"a": "queue a guarantees 4 tessera.dev/gpu, above its limit 2"},
		},
		{
			name:    "negative weight",
			specs:   []Spec{q("a", "", 0).weigh(-1), q("b", "a", 0)},
			invalid: map[string]string{"a": "weighs tessera.dev/gpu -1", "b": "under invalid queue a"},
		},
		{
			name:  "namespaces on a parent only warn",
			specs: []Spec{q("d", "", 0, "ns"), q("t", "d", 0)},
			warn:  "queue d has child queues and serves namespaces",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tree := Build(tc.specs)
			for _, name := range tree.Names() {
				got := tree.Invalid(name)
				want, bad := tc.invalid[name]
				if bad != (got != "") || !strings.Contains(got, want) {
					t.Errorf("Invalid(%s) = %q, want containing %q (invalid: %v)", name, got, want, bad)
				}
			}
			for name := range tc.invalid {
				if _, ok := tree.Spec(name); !ok {
					t.Errorf("queue %s is missing from the tree", name)
				}
			}
			warnings := strings.Join(tree.Warnings(), "\n")
			if (tc.warn == "") != (warnings == "") || !strings.Contains(warnings, tc.warn) {
				t.Errorf("Warnings = %q, want %q", warnings, tc.warn)
			}
		})
	}
}

// specs returns the specs the tree was built from, sorted by name.
func (t *Tree) specs() []Spec {
	var out []Spec
	for _, name := range t.Names() {
		out = append(out, t.nodes[name].spec)
	}
	return out
}

func TestTreeQueries(t *testing.T) {
	tree := departments()
	type answers struct {
		Path, Children, Leaves, Names []string
		Queue                         string
		Found                         bool
		Roots                         []string
	}
	queue, found := tree.QueueOf("ns-b2")
	got := answers{
		Path: tree.Path("b2"), Children: tree.Children("dept-a"), Leaves: tree.Leaves(), Names: tree.Names(),
		Queue: queue, Found: found, Roots: tree.Children(""),
	}
	want := answers{
		Path:     []string{"dept-b", "b2"},
		Children: []string{"a1", "a2"},
		Leaves:   []string{"a1", "a2", "b1", "b2"},
		Names:    []string{"a1", "a2", "b1", "b2", "dept-a", "dept-b"},
		Queue:    "b2", Found: true,
		Roots: []string{"dept-a", "dept-b"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("tree answers (-want +got):\n%s", diff)
	}
	if _, ok := tree.QueueOf("elsewhere"); ok {
		t.Error("QueueOf(elsewhere) found a queue")
	}
	if p := tree.Path("nope"); p != nil {
		t.Errorf("Path(nope) = %v, want nil", p)
	}
	if why := tree.Invalid("nope"); why != "queue nope is not defined" {
		t.Errorf("Invalid(nope) = %q", why)
	}
}

// A namespace claimed twice stays governed, by an invalid queue: its work
// is refused, not let through.
func TestDoubleClaimFailsClosed(t *testing.T) {
	tree := Build([]Spec{q("a", "", 4, "shared"), q("b", "", 4, "shared")})
	queue, ok := tree.QueueOf("shared")
	if !ok || queue != "a" {
		t.Fatalf("QueueOf(shared) = %q, %v; want a, true", queue, ok)
	}
	s := &State{Tree: tree, Capacity: gpus(8)}
	d := s.Admit(queue, gpus(1))
	if d.Allowed || !strings.Contains(d.Reason, "queue a admits nothing until it is fixed: namespace shared is claimed by queues a, b") {
		t.Errorf("Admit = %+v, want refused naming the double claim", d)
	}
}
