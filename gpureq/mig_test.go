package gpureq

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/tessera-gpu/tessera/allocator/quota"
	"github.com/tessera-gpu/tessera/api"
)

func TestParsePodMIG(t *testing.T) {
	mig1, mig3 := api.MIGResource("1g.5gb"), api.MIGResource("3g.20gb")
	tests := []struct {
		name  string
		pod   *corev1.Pod
		want  map[string]int64
		quota quota.Resources
		code  Code
	}{
		{name: "one profile", pod: podOf(nil, withQ(ctr("a", 0, 0, 0), mig1, "2")),
			want: map[string]int64{"1g.5gb": 2}, quota: quota.Resources{mig1: 2}},
		{name: "two containers, two profiles", pod: podOf(nil, withQ(ctr("a", 0, 0, 0), mig1, "1"), withQ(withQ(ctr("b", 0, 0, 0), mig1, "1"), mig3, "1")),
			want: map[string]int64{"1g.5gb": 2, "3g.20gb": 1}, quota: quota.Resources{mig1: 2, mig3: 1}},
		{name: "init container takes the max", pod: podOf(
			[]corev1.Container{withQ(ctr("init", 0, 0, 0), mig1, "3"), sidecar(withQ(ctr("side", 0, 0, 0), mig1, "1"))},
			withQ(ctr("a", 0, 0, 0), mig1, "1")),
			want: map[string]int64{"1g.5gb": 3}, quota: quota.Resources{mig1: 3}}, // the init container runs alone
		{name: "MIG and whole GPUs", pod: podOf(nil, withQ(ctr("a", 0, 0, 0), mig1, "1"), ctr("b", 1, 0, 0)), code: CodeMIGAndOther},
		{name: "MIG and a slice", pod: podOf(nil, withQ(ctr("a", 0, 4, 0), mig1, "1")), code: CodeMIGAndOther},
		{name: "a fraction", pod: podOf(nil, withQ(ctr("a", 0, 0, 0), mig1, "500m")), code: CodeInvalidQuantity},
		{name: "a profile no resource name holds is not a MIG resource", pod: podOf(nil, withQ(ctr("a", 0, 0, 0), "tessera.dev/mig-1g.5gb+me", "1"))},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := ParsePod(tc.pod)
			if tc.code != "" {
				var r *Refusal
				if !errors.As(err, &r) || r.Code != tc.code {
					t.Fatalf("ParsePod = %v, want refusal %s", err, tc.code)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, p.MIG); diff != "" {
				t.Errorf("MIG (-want +got):\n%s", diff)
			}
			got := QuotaCount(tc.pod)
			if len(tc.quota) == 0 && len(got) == 0 {
				return
			}
			if diff := cmp.Diff(tc.quota, got); diff != "" {
				t.Errorf("QuotaCount (-want +got):\n%s", diff)
			}
		})
	}
}

func TestCheckAssignmentMIG(t *testing.T) {
	mig1 := api.MIGResource("1g.5gb")
	pod := podOf(nil, withQ(ctr("a", 0, 0, 0), mig1, "1"))
	ref := func(uuid, profile string) api.MIGRef {
		return api.MIGRef{UUID: uuid, Profile: profile, GPU: api.GPURef{UUID: "GPU-00000000-0000-0000-0000-000000000000"}}
	}
	for _, tc := range []struct {
		name string
		mig  []api.MIGRef
		ok   bool
	}{
		{"its instance", []api.MIGRef{ref("MIG-00000000-0000-0000-0000-000000000001", "1g.5gb")}, true},
		{"one too many", []api.MIGRef{ref("MIG-00000000-0000-0000-0000-000000000001", "1g.5gb"), ref("MIG-00000000-0000-0000-0000-000000000002", "1g.5gb")}, false},
		{"another profile", []api.MIGRef{ref("MIG-00000000-0000-0000-0000-000000000001", "3g.20gb")}, false},
	} {
		a := api.NewAssignment()
		a.Containers = append(a.Containers, api.ContainerAssignment{Name: "a", MIG: tc.mig})
		err := CheckAssignment(a, pod)
		var r *Refusal
		if tc.ok != (err == nil) || (err != nil && (!errors.As(err, &r) || r.Code != CodeAssignmentDisagrees)) {
			t.Errorf("%s: CheckAssignment = %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
}
