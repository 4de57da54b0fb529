package api

import (
	"strings"
	"testing"
)

func TestParseGPUCount(t *testing.T) {
	const digits, outside, zero = "digits 0-9 only", "must be 1..16", "no leading zero"
	for _, tc := range []struct {
		value string
		want  int    // 0: refused
		why   string // what the refusal says
	}{
		{value: "1", want: 1}, {value: "2", want: 2}, {value: "4", want: 4}, {value: "16", want: 16},
		{"", 0, "empty"}, {"0", 0, outside}, {"17", 0, outside}, {"99", 0, outside}, {"100", 0, outside},
		{"9223372036854775808", 0, outside}, {"-1", 0, digits}, {"+2", 0, digits},
		{"02", 0, zero}, {" 2", 0, digits}, {"2 ", 0, digits}, {"2.0", 0, digits}, {"1.5", 0, digits},
		{"2e0", 0, digits}, {"two", 0, digits}, {"abc", 0, digits}, {"eight", 0, digits},
		{"0x2", 0, digits}, {"２", 0, digits},
	} {
		got, err := ParseGPUCount(tc.value)
		switch {
		case tc.want == 0 && err == nil:
			t.Errorf("ParseGPUCount(%q) = %d, want an error", tc.value, got)
		case tc.want == 0 && !strings.Contains(err.Error(), AnnotationGPUCount):
			t.Errorf("ParseGPUCount(%q): error %q does not name %s", tc.value, err, AnnotationGPUCount)
		case tc.want == 0 && !strings.Contains(err.Error(), tc.why):
			t.Errorf("ParseGPUCount(%q): error %q, want one saying %q", tc.value, err, tc.why)
		case tc.want != 0 && (err != nil || got != tc.want):
			t.Errorf("ParseGPUCount(%q) = %d, %v, want %d", tc.value, got, err, tc.want)
		}
	}
}

func TestGetGPUCount(t *testing.T) {
	if n, set, err := GetGPUCount(nil); n != 1 || set || err != nil {
		t.Errorf("no annotation: %d, %v, %v; want 1, false, nil", n, set, err)
	}
	if n, set, err := GetGPUCount(map[string]string{AnnotationGPUCount: "4"}); n != 4 || !set || err != nil {
		t.Errorf("\"4\": %d, %v, %v; want 4, true, nil", n, set, err)
	}
	if n, set, err := GetGPUCount(map[string]string{AnnotationGPUCount: "0"}); n != 0 || !set || err == nil {
		t.Errorf("\"0\": %d, %v, %v; want 0, true and an error", n, set, err)
	}
}

func TestSharedSpreadValidate(t *testing.T) {
	g := func(i int) GPURef {
		return GPURef{UUID: "GPU-" + strings.Repeat(string(rune('a'+i)), 8) + "-0000-0000-0000-000000000000", Index: i}
	}
	spread := func(first GPURef, more ...GPURef) *Assignment {
		a := NewAssignment()
		a.Containers = append(a.Containers, ContainerAssignment{Name: "main", Shared: &SharedGPU{GPU: first, Spread: more, MemoryMiB: 8192, Cores: 20}})
		return a
	}
	many := make([]GPURef, MaxGPUCount)
	for i := range many {
		many[i] = GPURef{UUID: "GPU-" + strings.Repeat("0", 7) + string(rune('a'+i)) + "-0000-0000-0000-000000000000", Index: i + 1}
	}
	withWhole := spread(g(0), g(1))
	withWhole.Containers[0].GPUs = []GPURef{g(1)}
	for _, tc := range []struct {
		name string
		a    *Assignment
		want string // "": valid
	}{
		{"two GPUs in index order", spread(g(0), g(1)), ""},
		{"four GPUs", spread(g(0), g(1), g(2), g(3)), ""},
		{"out of index order", spread(g(1), g(0)), "increasing index order"},
		{"a GPU twice", spread(g(0), g(0)), "listed twice"},
		{"a bad UUID", spread(g(0), GPURef{UUID: "gpu1", Index: 1}), "spread[0].uuid"},
		{"more than 16 GPUs", spread(g(0), many...), "at most 16 GPUs"},
		{"also a whole GPU", withWhole, "listed twice"},
	} {
		err := tc.a.Validate()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: error %v, want one saying %q", tc.name, err, tc.want)
		}
	}
	s := SharedGPU{GPU: g(2), Spread: []GPURef{g(3)}}
	if got := strings.Join(s.UUIDs(), ","); got != g(2).UUID+","+g(3).UUID {
		t.Errorf("UUIDs() = %s", got)
	}
}
