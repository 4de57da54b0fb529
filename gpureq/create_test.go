package gpureq

import (
	"errors"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

func TestCheckCreate(t *testing.T) {
	pod := func(init bool, kv ...string) *corev1.Pod {
		l := corev1.ResourceList{}
		for i := 0; i < len(kv); i += 2 {
			l[corev1.ResourceName(kv[i])] = resource.MustParse(kv[i+1])
		}
		c := corev1.Container{Name: "c", Resources: corev1.ResourceRequirements{Limits: l}}
		p := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main"}}}}
		if init {
			p.Spec.InitContainers = []corev1.Container{c}
		} else {
			p.Spec.Containers = []corev1.Container{c}
		}
		return p
	}
	tests := []struct {
		name string
		pod  *corev1.Pod
		want Code // "" when allowed
	}{
		{"whole GPUs", pod(false, "tessera.dev/gpu", "2"), ""},
		{"a slice", pod(false, "tessera.dev/gpu-memory", "24", "tessera.dev/gpu-core", "30"), ""},
		{"MIG", pod(false, "tessera.dev/mig-1g.5gb", "1"), ""},
		{"another vendor's zero", pod(false, "example.com/fpga", "0"), ""},
		{"memory in bytes is not Tessera's", pod(false, "memory", "24Gi"), ""},
		{"zero GPUs", pod(false, "tessera.dev/gpu", "0"), CodeZeroQuantity},
		{"zero cores in an init container", pod(true, "tessera.dev/gpu-core", "0", "tessera.dev/gpu-memory", "4"), CodeZeroQuantity},
		{"a typo", pod(false, "tessera.dev/gpu-mem", "4"), CodeUnknownResource},
		{"not a MIG profile", pod(false, "tessera.dev/mig-bogus", "1"), CodeUnknownResource},
		{"memory units in GiB", pod(false, "tessera.dev/gpu-memory", "4Gi"), CodeMemUnitsAsBytes},
		{"memory units in decimal bytes", pod(false, "tessera.dev/gpu-memory", "24G"), CodeMemUnitsAsBytes},
		{"memory units at the bound", pod(false, "tessera.dev/gpu-memory", "1048576"), ""},
		{"memory units past the bound", pod(false, "tessera.dev/gpu-memory", "1048577"), CodeMemUnitsAsBytes},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckCreate(tc.pod)
			var r *Refusal
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && (!errors.As(err, &r) || r.Code != tc.want):
				t.Fatalf("CheckCreate = %v, want code %s", err, tc.want)
			case tc.want != "" && (r.Container != "c" || r.Message == ""):
				t.Errorf("refusal %+v names no container or says nothing", r)
			}
		})
	}
}
