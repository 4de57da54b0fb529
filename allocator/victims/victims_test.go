package victims

import (
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// Candidates are "node/name"; enough is "every candidate of some node in
// full is taken"; the taker refuses after a budget of takes.
func TestChoose(t *testing.T) {
	onNode := func(need map[string]int) func([]string) bool {
		return func(v []string) bool {
			got := map[string]int{}
			for _, w := range v {
				n, _, _ := strings.Cut(w, "/")
				got[n]++
				if got[n] >= need[n] && need[n] > 0 {
					return true
				}
			}
			return false
		}
	}
	budget := func(n int) func() func(string) bool {
		return func() func(string) bool {
			left := n
			return func(string) bool {
				if left == 0 {
					return false
				}
				left--
				return true
			}
		}
	}
	key := func(w string) string { return w }
	tests := []struct {
		name   string
		cands  []string
		budget int
		need   map[string]int
		want   []string
		wantOK bool
	}{
		{name: "nothing needed", cands: []string{"a/1"}, budget: 5, want: nil, wantOK: true},
		{name: "the prefix, less what is not needed", cands: []string{"a/1", "b/1", "a/2", "b/2"}, budget: 4, need: map[string]int{"b": 2},
			want: []string{"b/1", "b/2"}, wantOK: true},
		{name: "a budget spent on useless victims is spent again on the needed ones", cands: []string{"a/1", "b/1", "a/2", "b/2"}, budget: 2,
			need: map[string]int{"b": 2}, want: []string{"b/1", "b/2"}, wantOK: true},
		{name: "not enough", cands: []string{"a/1", "b/1"}, budget: 5, need: map[string]int{"b": 2}, wantOK: false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			enough := onNode(tc.need)
			if tc.need == nil {
				enough = func([]string) bool { return true }
			}
			got, ok := Choose(slices.Clone(tc.cands), key, budget(tc.budget), enough)
			if ok != tc.wantOK {
				t.Fatalf("Choose = %v, %v; want ok %v", got, ok, tc.wantOK)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("victims (-want +got):\n%s", diff)
			}
		})
	}
}
