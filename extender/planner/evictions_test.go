package planner

import (
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/types"
)

// TestEvictions checks that an eviction counts its pod as gone for
// EvictionMemory and is forgotten after.
func TestEvictions(t *testing.T) {
	var e Evictions
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if got := e.Current(t0); len(got) != 0 {
		t.Fatalf("empty: %v", got)
	}
	e.Add("a", t0)
	e.Add("b", t0.Add(time.Minute))
	for _, tc := range []struct {
		at   time.Duration
		want map[types.UID]bool
	}{
		{at: 0, want: map[types.UID]bool{"a": true, "b": true}},
		{at: EvictionMemory - time.Nanosecond, want: map[types.UID]bool{"a": true, "b": true}},
		{at: EvictionMemory, want: map[types.UID]bool{"b": true}},
		{at: EvictionMemory + time.Minute, want: map[types.UID]bool{}},
	} {
		if diff := gocmp.Diff(tc.want, e.Current(t0.Add(tc.at))); diff != "" {
			t.Errorf("at +%v (-want +got):\n%s", tc.at, diff)
		}
	}
}
