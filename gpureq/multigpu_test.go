package gpureq

import (
	"slices"
	"strings"
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

// FuzzChooseGPUs checks ChooseGPUs against the group rule on random nodes
// built from random slices: what it picks is n distinct GPUs with room,
// in index order, that Groups.Check admits; and when it finds nothing, no
// admissible set exists (checked by brute force over all subsets).
func FuzzChooseGPUs(f *testing.F) {
	f.Add(uint8(4), uint8(2), uint16(0b1010), []byte{0x03, 0x04}, false)
	f.Add(uint8(8), uint8(3), uint16(0xff), []byte{0x07, 0x18, 0x20}, true)
	f.Add(uint8(2), uint8(2), uint16(0), []byte{}, false)
	f.Fuzz(func(t *testing.T, gpus, n uint8, room uint16, sets []byte, requireClique bool) {
		g, k := int(gpus%9), int(n%5)
		if g == 0 {
			return
		}
		uuid := func(i int) string { return string(rune('A' + i)) }
		var groups Groups
		for _, mask := range sets { // each byte: the GPUs of one slice
			var s []string
			for i := range g {
				if mask&(1<<i) != 0 {
					s = append(s, uuid(i))
				}
			}
			groups.Add(s)
		}
		cands := make([]Candidate, g)
		for i := range g {
			cands[i] = Candidate{UUID: uuid(i), Index: g - 1 - i, Room: room&(1<<i) != 0, FreeMiB: int64(i)}
			cands[i].Group, _ = groups.Of(uuid(i))
			if key := cands[i].Group; key != conflict && groups.InSet(uuid(i)) != strings.Contains(key, ",") {
				t.Fatalf("GPU %s: InSet %v, group %q", uuid(i), groups.InSet(uuid(i)), key)
			}
		}
		cliques := [][]int{}
		for i := 0; i < g; i += 2 {
			cliques = append(cliques, []int{i, min(i+1, g-1)})
		}
		admissible := func(ps []int) bool {
			var us []string
			for _, p := range ps {
				if !cands[p].Room {
					return false
				}
				us = append(us, cands[p].UUID)
			}
			if groups.Check(us) != nil {
				return false
			}
			if requireClique && len(ps) > 1 {
				for _, p := range ps {
					if p/2 != ps[0]/2 {
						return false
					}
				}
			}
			return true
		}
		pos, ok := ChooseGPUs(cands, k, cliques, requireClique)
		if ok {
			if len(pos) != k || !admissible(pos) {
				t.Fatalf("ChooseGPUs(n=%d) = %v: not %d admissible GPUs (%+v)", k, pos, k, cands)
			}
			for i := 1; i < len(pos); i++ {
				if pos[i] == pos[i-1] || cands[pos[i]].Index <= cands[pos[i-1]].Index {
					t.Fatalf("ChooseGPUs = %v: not distinct GPUs in index order", pos)
				}
			}
			return
		}
		if k < 1 || k > g {
			return
		}
		// Nothing found: no subset of k GPUs is admissible.
		for mask := 0; mask < 1<<g; mask++ {
			var ps []int
			for i := range g {
				if mask&(1<<i) != 0 {
					ps = append(ps, i)
				}
			}
			if len(ps) == k && admissible(ps) {
				t.Fatalf("ChooseGPUs(n=%d) found nothing, but %v is admissible (%+v)", k, ps, cands)
			}
		}
	})
}
