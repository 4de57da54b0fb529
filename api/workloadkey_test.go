package api

import "testing"

func TestWorkloadKeys(t *testing.T) {
	for _, tc := range []struct {
		key, name, user string
		pod             bool
	}{
		{PodKey("ns", "p"), "ns/p", "pod ns/p", true},
		{GangUnitKey("ns/g"), "ns/g", "gang ns/g", false},
		{"ns/g", "ns/g", "gang ns/g", false},
		{ExtraMemberKey(GangUnitKey("ns/g"), "g-3"), "ns/g member g-3", "gang ns/g member g-3", false},
	} {
		if got := KeyName(tc.key); got != tc.name {
			t.Errorf("KeyName(%q) = %q, want %q", tc.key, got, tc.name)
		}
		if got := WorkloadName(tc.key); got != tc.user {
			t.Errorf("WorkloadName(%q) = %q, want %q", tc.key, got, tc.user)
		}
		if got := IsPodKey(tc.key); got != tc.pod {
			t.Errorf("IsPodKey(%q) = %v, want %v", tc.key, got, tc.pod)
		}
	}
}
