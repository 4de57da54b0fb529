package gpureq

import (
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// codeOf is r's code, "" for nil.
func codeOf(r *Refusal) Code {
	if r == nil {
		return ""
	}
	return r.Code
}

func TestPerGPU(t *testing.T) {
	for _, tc := range []struct {
		name string
		c    Container
		n    int
		want Container
		code Code
	}{
		{"one GPU", Container{Name: "m", MemUnits: 3, Cores: 7}, 1, Container{Name: "m", MemUnits: 3, Cores: 7}, ""},
		{"even", Container{Name: "m", MemUnits: 16, Cores: 40}, 2, Container{Name: "m", MemUnits: 8, Cores: 20}, ""},
		{"core-only", Container{Name: "m", Cores: 60}, 4, Container{Name: "m", Cores: 15}, ""},
		{"odd memory", Container{Name: "m", MemUnits: 3, Cores: 40}, 2, Container{}, CodeGPUCountUneven},
		{"odd cores", Container{Name: "m", MemUnits: 4, Cores: 30}, 4, Container{}, CodeGPUCountUneven},
		{"whole GPUs are not split", Container{Name: "m", Whole: 3}, 2, Container{Name: "m", Whole: 3}, ""},
	} {
		got, r := tc.c.PerGPU(tc.n)
		if codeOf(r) != tc.code {
			t.Errorf("%s: refusal %v, want %q", tc.name, r, tc.code)
			continue
		}
		if tc.code == "" && !cmp.Equal(got, tc.want) {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

func TestGroups(t *testing.T) {
	var g Groups
	g.Add([]string{"B", "A"}) // a slice over A and B
	g.Add([]string{"C"})      // a slice of C alone
	g.Add([]string{"A", "B"}) // another over the same set
	for _, tc := range []struct {
		name  string
		uuids []string
		code  Code
	}{
		{"the same set, any order", []string{"B", "A"}, ""},
		{"C alone again", []string{"C"}, ""},
		{"a free GPU", []string{"D"}, ""},
		{"two free GPUs", []string{"D", "E"}, ""},
		{"one GPU of the set alone", []string{"A"}, CodeMPSGroup},
		{"a bigger set over the set", []string{"A", "B", "D"}, CodeMPSGroup},
		{"a set over C", []string{"C", "D"}, CodeMPSGroup},
	} {
		if got := codeOf(g.Check(tc.uuids)); got != tc.code {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.code)
		}
	}
	if !g.InSet("A") || g.InSet("C") || g.InSet("D") {
		t.Errorf("InSet: A %v, C %v, D %v; want true, false, false", g.InSet("A"), g.InSet("C"), g.InSet("D"))
	}
	if got := g.Keys(); !slices.Equal(got, []string{"A,B", "C"}) {
		t.Errorf("Keys() = %v", got)
	}
	// A broken record (C in two sets) takes nothing until it ends.
	g.Add([]string{"C", "D"})
	if codeOf(g.Check([]string{"C"})) != CodeMPSGroup || codeOf(g.Check([]string{"C", "D"})) != CodeMPSGroup {
		t.Errorf("a GPU of conflicting sets admits a slice")
	}
	if got := g.Keys(); !slices.Equal(got, []string{"A,B", "C,D"}) {
		t.Errorf("Keys() with a conflict = %v, want the conflicting GPU left out", got)
	}
}

func TestChooseGPUs(t *testing.T) {
	free := func(uuid string, index int) Candidate {
		return Candidate{UUID: uuid, Index: index, Room: true, FreeMiB: 1000}
	}
	set := func(c Candidate, key string, freeMiB int64) Candidate {
		c.Group, c.FreeMiB = key, freeMiB
		return c
	}
	full := func(c Candidate) Candidate { c.Room = false; return c }
	a, b, c, d := free("A", 0), free("B", 1), free("C", 2), free("D", 3)
	for _, tc := range []struct {
		name          string
		gpus          []Candidate
		n             int
		cliques       [][]int
		requireClique bool
		want          []int // nil: none fits
	}{
		{"lowest free GPUs", []Candidate{a, b, c, d}, 2, nil, false, []int{0, 1}},
		{"an existing set of n first", []Candidate{a, b, set(c, "C,D", 500), set(d, "C,D", 500)}, 2, nil, false, []int{2, 3}},
		{"the fuller of two sets", []Candidate{set(a, "A,B", 900), set(b, "A,B", 900), set(c, "C,D", 100), set(d, "C,D", 100)}, 2, nil, false, []int{2, 3}},
		{"a set without room on one GPU", []Candidate{a, b, set(c, "C,D", 500), full(set(d, "C,D", 0))}, 2, nil, false, []int{0, 1}},
		{"a set of another size is skipped", []Candidate{set(a, "A,B,C", 1), set(b, "A,B,C", 1), set(c, "A,B,C", 1), d}, 2, nil, false, nil},
		{"a GPU of single slices is not free", []Candidate{set(a, "A", 10), b, c, d}, 2, nil, false, []int{1, 2}},
		{"the smallest clique that suffices", []Candidate{a, b, c, d}, 2, [][]int{{0, 1, 2}, {3}}, false, []int{0, 1}},
		{"a clique over lower indices across cliques", []Candidate{a, b, c, d}, 2, [][]int{{0, 2}, {1, 3}}, false, []int{0, 2}},
		{"no clique has room: anywhere", []Candidate{a, full(b), c, full(d)}, 2, [][]int{{0, 1}, {2, 3}}, false, []int{0, 2}},
		{"no clique has room: required", []Candidate{a, full(b), c, full(d)}, 2, [][]int{{0, 1}, {2, 3}}, true, nil},
		{"required and a clique fits", []Candidate{a, full(b), c, d}, 2, [][]int{{0, 1}, {2, 3}}, true, []int{2, 3}},
		{"more than the node", []Candidate{a, b}, 3, nil, false, nil},
		{"four", []Candidate{d, c, b, a}, 4, nil, false, []int{3, 2, 1, 0}},
	} {
		got, ok := ChooseGPUs(tc.gpus, tc.n, tc.cliques, tc.requireClique)
		if ok != (tc.want != nil) || !slices.Equal(got, tc.want) {
			t.Errorf("%s: %v, %v; want %v", tc.name, got, ok, tc.want)
		}
	}
}

func TestCheckCount(t *testing.T) {
	if r := CheckCount(4, 4); r != nil {
		t.Errorf("4 of 4: %v", r)
	}
	if r := CheckCount(5, 4); codeOf(r) != CodeGPUCountAboveNode {
		t.Errorf("5 of 4: %v, want %s", r, CodeGPUCountAboveNode)
	}
}
