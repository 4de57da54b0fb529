package extender

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/tessera-gpu/tessera/allocator"
	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/extender/internal/testbuild"
)

func TestParseDemand(t *testing.T) {
	always := corev1.ContainerRestartPolicyAlways
	withInit := func(p *corev1.Pod, sidecar bool, gpus int64) *corev1.Pod {
		c := corev1.Container{Name: "init", Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
			api.ResourceGPU: *resource.NewQuantity(gpus, resource.DecimalSI)}}}
		if sidecar {
			c.RestartPolicy = &always
		}
		p.Spec.InitContainers = append(p.Spec.InitContainers, c)
		return p
	}
	tests := []struct {
		name    string
		pod     *corev1.Pod
		want    Demand
		wantErr bool
	}{
		{name: "cpu only", pod: testbuild.Pod("p").CPU("2").Obj(), want: Demand{CPUMilli: 2000}},
		{name: "shared memory and cores", pod: testbuild.Pod("p").Shared(8, 30).Obj(),
			want: Demand{Shares: []ContainerShare{{Name: "main", MemUnits: 8, Cores: 30}}}},
		{name: "cores only", pod: testbuild.Pod("p").Shared(0, 50).Obj(),
			want: Demand{Shares: []ContainerShare{{Name: "main", Cores: 50}}}},
		{name: "whole with model and nvlink", pod: testbuild.Pod("p").Whole(4).Model("A100|H100").NVLink().Obj(),
			want: Demand{WholeGPUs: 4, Models: []string{"A100", "H100"}, NVLink: true}},
		{name: "nvlink ignored without whole GPUs", pod: testbuild.Pod("p").Shared(1, 0).NVLink().Obj(),
			want: Demand{Shares: []ContainerShare{{Name: "main", MemUnits: 1}}}},
		{name: "init container takes the max", pod: withInit(testbuild.Pod("p").Whole(2).Obj(), false, 3), want: Demand{WholeGPUs: 3}},
		{name: "sidecar adds up", pod: withInit(testbuild.Pod("p").Whole(2).Obj(), true, 3), want: Demand{WholeGPUs: 5}},
		{name: "whole and shared", pod: testbuild.Pod("p").Whole(1).Shared(1, 0).Obj(), wantErr: true},
		{name: "more than one GPU of cores", pod: testbuild.Pod("p").Shared(0, 150).Obj(), wantErr: true},
		{name: "bad model list", pod: testbuild.Pod("p").Whole(1).Model("A100||H100").Obj(), wantErr: true},
		{name: "bad nvlink value", pod: testbuild.Pod("p").Whole(2).Obj(), wantErr: true},
		{name: "fractional GPU", pod: func() *corev1.Pod {
			p := testbuild.Pod("p").Obj()
			p.Spec.Containers[0].Resources.Limits[api.ResourceGPU] = resource.MustParse("500m")
			return p
		}(), wantErr: true},
	}
	tests[10].pod.Annotations[api.AnnotationNVLink] = "maybe"
	counted := func(p *corev1.Pod, n string) *corev1.Pod {
		p.Annotations[api.AnnotationGPUCount] = n
		return p
	}
	tests = append(tests, []struct {
		name    string
		pod     *corev1.Pod
		want    Demand
		wantErr bool
	}{
		{name: "gpu-count 2: the share of each GPU", pod: counted(testbuild.Pod("p").Shared(16, 40).Obj(), "2"),
			want: Demand{Shares: []ContainerShare{{Name: "main", MemUnits: 8, Cores: 20}}, GPUCount: 2}},
		{name: "gpu-count 2 keeps nvlink for its GPUs", pod: counted(testbuild.Pod("p").Shared(4, 0).NVLink().Obj(), "2"),
			want: Demand{Shares: []ContainerShare{{Name: "main", MemUnits: 2}}, GPUCount: 2, NVLink: true}},
		{name: "gpu-count 2 over 150 cores", pod: counted(testbuild.Pod("p").Shared(2, 150).Obj(), "2"),
			want: Demand{Shares: []ContainerShare{{Name: "main", MemUnits: 1, Cores: 75}}, GPUCount: 2}},
		{name: "gpu-count uneven", pod: counted(testbuild.Pod("p").Shared(3, 0).Obj(), "2"), wantErr: true},
		{name: "gpu-count garbage", pod: counted(testbuild.Pod("p").Shared(2, 0).Obj(), "2 "), wantErr: true},
		{name: "gpu-count on a gang member", pod: func() *corev1.Pod {
			p := counted(testbuild.Pod("p").Shared(2, 0).Obj(), "2")
			p.Labels = map[string]string{api.LabelPodGroup: "g"}
			return p
		}(), wantErr: true},
	}...)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseDemand(tc.pod)
			if tc.wantErr {
				if !errors.Is(err, ErrInvalidDemand) {
					t.Fatalf("ParseDemand() error = %v, want ErrInvalidDemand", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseDemand() error = %v", err)
			}
			if tc.want.GPUCount == 0 {
				tc.want.GPUCount = 1
			}
			// Align is numa.PodDemand's (allocator/numa tests it).
			if diff := cmp.Diff(tc.want, got, cmpopts.IgnoreFields(Demand{}, "Align")); diff != "" {
				t.Errorf("ParseDemand() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDemandRequest(t *testing.T) {
	tests := []struct {
		name string
		d    Demand
		want allocator.Request
	}{
		{name: "memory units", d: Demand{Shares: []ContainerShare{{MemUnits: 4, Cores: 20}}},
			want: allocator.Request{GPUMemMiB: 4096, GPUMilli: 200}},
		{name: "cores default memory to their share", d: Demand{Shares: []ContainerShare{{Cores: 25}}},
			want: allocator.Request{GPUMemMiB: 10240, GPUMilli: 250}},
		{name: "a whole GPU of cores stays a slice", d: Demand{Shares: []ContainerShare{{MemUnits: 1, Cores: 100}}},
			want: allocator.Request{GPUMemMiB: 1024, GPUMilli: 999}},
		{name: "two containers add up", d: Demand{Shares: []ContainerShare{{MemUnits: 1, Cores: 10}, {MemUnits: 2, Cores: 20}}},
			want: allocator.Request{GPUMemMiB: 3072, GPUMilli: 300}},
		{name: "whole", d: Demand{WholeGPUs: 2, CPUMilli: 100}, want: allocator.Request{GPUs: 2, CPUMilli: 100}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, tc.d.Request(1024, 40960)); diff != "" {
				t.Errorf("Request() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestModelMatches(t *testing.T) {
	tests := []struct {
		model, want string
		match       bool
	}{
		{"NVIDIA A100-SXM4-40GB", "A100", true},
		{"NVIDIA A100-SXM4-40GB", "a100-sxm4-40gb", true},
		{"NVIDIA A100-SXM4-40GB", "A10", false},
		{"NVIDIA H100 80GB HBM3", "H100", true},
		{"NVIDIA A100-SXM4-40GB", "H100", false},
		{"A100", "", false},
	}
	for _, tc := range tests {
		if got := api.ModelMatches(tc.model, tc.want); got != tc.match {
			t.Errorf("ModelMatches(%q, %q) = %v, want %v", tc.model, tc.want, got, tc.match)
		}
	}
}
