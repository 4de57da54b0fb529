package gpureq

import (
	"errors"
	"math"
	"math/rand"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	resourcehelper "k8s.io/component-helpers/resource"

	"github.com/tessera-gpu/tessera/allocator/quota"
	"github.com/tessera-gpu/tessera/api"
)

// ctr is a container asking for whole GPUs, memory units and cores as
// limits (0: not set).
func ctr(name string, whole, mem, cores int64) corev1.Container {
	c := corev1.Container{Name: name, Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{}}}
	for _, r := range []struct {
		name corev1.ResourceName
		v    int64
	}{{api.ResourceGPU, whole}, {api.ResourceGPUMemory, mem}, {api.ResourceGPUCore, cores}} {
		if r.v != 0 {
			c.Resources.Limits[r.name] = *resource.NewQuantity(r.v, resource.DecimalSI)
		}
	}
	return c
}

func sidecar(c corev1.Container) corev1.Container {
	always := corev1.ContainerRestartPolicyAlways
	c.RestartPolicy = &always
	return c
}

func withQ(c corev1.Container, name corev1.ResourceName, q string) corev1.Container {
	c.Resources.Limits[name] = resource.MustParse(q)
	return c
}

func podOf(inits []corev1.Container, cs ...corev1.Container) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns"}, Spec: corev1.PodSpec{InitContainers: inits, Containers: cs}}
}

// counted sets the pod's api.AnnotationGPUCount.
func counted(p *corev1.Pod, n string) *corev1.Pod {
	p.Annotations = map[string]string{api.AnnotationGPUCount: n}
	return p
}

func TestParsePod(t *testing.T) {
	cpuMem := ctr("main", 0, 0, 0)
	cpuMem.Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1500m"), corev1.ResourceMemory: resource.MustParse("1Gi")}
	limitsOnly := ctr("main", 0, 0, 0)
	limitsOnly.Resources.Limits = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourceMemory: resource.MustParse("100Mi")}
	overhead := podOf(nil, cpuMem)
	overhead.Spec.Overhead = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("250m"), corev1.ResourceMemory: resource.MustParse("1")}
	tests := []struct {
		name string
		pod  *corev1.Pod
		want Pod
		code Code // "": accepted
	}{
		{name: "nothing", pod: podOf(nil, ctr("main", 0, 0, 0)), want: Pod{}},
		{name: "cpu and memory", pod: podOf(nil, cpuMem), want: Pod{CPUMilli: 1500, MemMiB: 1024}},
		{name: "cpu and memory default to limits", pod: podOf(nil, limitsOnly), want: Pod{CPUMilli: 2000, MemMiB: 100}},
		{name: "overhead counts, memory rounds up", pod: overhead, want: Pod{CPUMilli: 1750, MemMiB: 1025}},
		{name: "absurd CPU and memory saturate", pod: func() *corev1.Pod {
			c := ctr("main", 0, 0, 0)
			c.Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("9223372036854775807"), corev1.ResourceMemory: resource.MustParse("8E")}
			p := podOf(nil, c)
			p.Spec.Overhead = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("8E")}
			return p
		}(), want: Pod{CPUMilli: math.MaxInt64, MemMiB: math.MaxInt64 >> 20}},
		{name: "whole", pod: podOf(nil, ctr("main", 0, 0, 0), ctr("train", 2, 0, 0)),
			want: Pod{Containers: []Container{{Name: "train", Whole: 2}}, Peak: Units{Whole: 2}}},
		{name: "slice", pod: podOf(nil, ctr("main", 0, 8, 30)),
			want: Pod{Containers: []Container{{Name: "main", MemUnits: 8, Cores: 30}}, Peak: Units{MemUnits: 8, Cores: 30}}},
		{name: "core-only", pod: podOf(nil, ctr("main", 0, 0, 30)),
			want: Pod{Containers: []Container{{Name: "main", Cores: 30}}, Peak: Units{Cores: 30}}},
		{name: "memory-only", pod: podOf(nil, ctr("main", 0, 4, 0)),
			want: Pod{Containers: []Container{{Name: "main", MemUnits: 4}}, Peak: Units{MemUnits: 4}}},
		{name: "two slices add up", pod: podOf(nil, ctr("a", 0, 2, 20), ctr("b", 0, 3, 30)),
			want: Pod{Containers: []Container{{Name: "a", MemUnits: 2, Cores: 20}, {Name: "b", MemUnits: 3, Cores: 30}}, Peak: Units{MemUnits: 5, Cores: 50}}},
		{name: "init container: the larger", pod: podOf([]corev1.Container{ctr("init", 3, 0, 0)}, ctr("main", 2, 0, 0)),
			want: Pod{Containers: []Container{{Name: "init", Kind: Init, Whole: 3}, {Name: "main", Whole: 2}}, Peak: Units{Whole: 3}}},
		{name: "sidecar adds up", pod: podOf([]corev1.Container{sidecar(ctr("side", 3, 0, 0))}, ctr("main", 2, 0, 0)),
			want: Pod{Containers: []Container{{Name: "side", Kind: Sidecar, Whole: 3}, {Name: "main", Whole: 2}}, Peak: Units{Whole: 5}}},
		{name: "init beside an earlier sidecar", pod: podOf([]corev1.Container{sidecar(ctr("side", 0, 2, 10)), ctr("init", 0, 10, 60)}, ctr("main", 0, 1, 10)),
			want: Pod{Containers: []Container{{Name: "side", Kind: Sidecar, MemUnits: 2, Cores: 10}, {Name: "init", Kind: Init, MemUnits: 10, Cores: 60}, {Name: "main", MemUnits: 1, Cores: 10}}, Peak: Units{MemUnits: 12, Cores: 70}}},
		{name: "init and main slices do not add up", pod: podOf([]corev1.Container{ctr("init", 0, 30, 60)}, ctr("main", 0, 30, 60)),
			want: Pod{Containers: []Container{{Name: "init", Kind: Init, MemUnits: 30, Cores: 60}, {Name: "main", MemUnits: 30, Cores: 60}}, Peak: Units{MemUnits: 30, Cores: 60}}},
		{name: "100 cores is a slice", pod: podOf(nil, ctr("main", 0, 1, 100)),
			want: Pod{Containers: []Container{{Name: "main", MemUnits: 1, Cores: 100}}, Peak: Units{MemUnits: 1, Cores: 100}}},
		{name: "requests win over limits", pod: func() *corev1.Pod {
			c := ctr("main", 0, 9, 0)
			c.Resources.Requests = corev1.ResourceList{api.ResourceGPUMemory: resource.MustParse("4")}
			return podOf(nil, c)
		}(), want: Pod{Containers: []Container{{Name: "main", MemUnits: 4}}, Peak: Units{MemUnits: 4}}},

		{name: "whole and shared in a container", pod: podOf(nil, ctr("main", 1, 1, 0)), code: CodeWholeAndShared},
		{name: "whole and shared in a pod", pod: podOf(nil, ctr("a", 1, 0, 0), ctr("b", 0, 1, 0)), code: CodeWholeAndShared},
		{name: "whole init, shared main", pod: podOf([]corev1.Container{ctr("init", 1, 0, 0)}, ctr("b", 0, 1, 0)), code: CodeWholeAndShared},
		{name: "more than 100 cores", pod: podOf(nil, ctr("main", 0, 1, 150)), code: CodeCoresAboveGPU},
		{name: "more than 100 cores together", pod: podOf(nil, ctr("a", 0, 1, 60), ctr("b", 0, 1, 60)), code: CodeCoresAboveGPU},
		{name: "sidecar and main above 100 cores", pod: podOf([]corev1.Container{sidecar(ctr("side", 0, 1, 60))}, ctr("main", 0, 1, 60)), code: CodeCoresAboveGPU},
		{name: "too many GPUs", pod: podOf(nil, ctr("main", 65, 0, 0)), code: CodeTooManyGPUs},
		{name: "fractional GPU", pod: podOf(nil, withQ(ctr("main", 0, 0, 0), api.ResourceGPU, "500m")), code: CodeInvalidQuantity},
		{name: "fractional memory", pod: podOf(nil, withQ(ctr("main", 0, 0, 10), api.ResourceGPUMemory, "1.5")), code: CodeInvalidQuantity},
		{name: "negative cores", pod: podOf(nil, withQ(ctr("main", 0, 1, 0), api.ResourceGPUCore, "-5")), code: CodeInvalidQuantity},

		// Multi-GPU slices.
		{name: "gpu-count 2 splits 16 units and 40 cores", pod: counted(podOf(nil, ctr("main", 0, 16, 40)), "2"),
			want: Pod{Containers: []Container{{Name: "main", MemUnits: 16, Cores: 40}}, Peak: Units{MemUnits: 16, Cores: 40}, GPUCount: 2}},
		{name: "gpu-count 1 is a slice of one GPU", pod: counted(podOf(nil, ctr("main", 0, 3, 30)), "1"),
			want: Pod{Containers: []Container{{Name: "main", MemUnits: 3, Cores: 30}}, Peak: Units{MemUnits: 3, Cores: 30}}},
		{name: "gpu-count 4: up to 100 cores on each GPU", pod: counted(podOf(nil, ctr("a", 0, 8, 200), ctr("b", 0, 4, 200)), "4"),
			want: Pod{Containers: []Container{{Name: "a", MemUnits: 8, Cores: 200}, {Name: "b", MemUnits: 4, Cores: 200}}, Peak: Units{MemUnits: 12, Cores: 400}, GPUCount: 4}},
		{name: "gpu-count 2: 101 cores on each GPU", pod: counted(podOf(nil, ctr("main", 0, 2, 202)), "2"), code: CodeCoresAboveGPU},
		{name: "gpu-count 2: two containers above 100 cores per GPU", pod: counted(podOf(nil, ctr("a", 0, 2, 120), ctr("b", 0, 2, 100)), "2"), code: CodeCoresAboveGPU},
		{name: "gpu-count 2: odd memory", pod: counted(podOf(nil, ctr("main", 0, 3, 40)), "2"), code: CodeGPUCountUneven},
		{name: "gpu-count 2: odd cores", pod: counted(podOf(nil, ctr("main", 0, 2, 15)), "2"), code: CodeGPUCountUneven},
		{name: "gpu-count 2: a sidecar that does not split", pod: counted(podOf([]corev1.Container{sidecar(ctr("side", 0, 1, 0))}, ctr("main", 0, 2, 20)), "2"), code: CodeGPUCountUneven},
		{name: "gpu-count 0", pod: counted(podOf(nil, ctr("main", 0, 2, 20)), "0"), code: CodeInvalidGPUCount},
		{name: "gpu-count 17", pod: counted(podOf(nil, ctr("main", 0, 34, 34)), "17"), code: CodeInvalidGPUCount},
		{name: "gpu-count not an integer", pod: counted(podOf(nil, ctr("main", 0, 2, 20)), "two"), code: CodeInvalidGPUCount},
		{name: "gpu-count on whole GPUs", pod: counted(podOf(nil, ctr("main", 2, 0, 0)), "2"), code: CodeGPUCountWithoutSlice},
		{name: "gpu-count 1 on a CPU-only pod", pod: counted(podOf(nil, cpuMem), "1"), code: CodeGPUCountWithoutSlice},
		{name: "gpu-count on MIG instances", pod: counted(podOf(nil, withQ(ctr("main", 0, 0, 0), api.MIGResource("1g.5gb"), "1")), "2"), code: CodeGPUCountWithoutSlice},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParsePod(tc.pod)
			if tc.code != "" {
				var r *Refusal
				if !errors.As(err, &r) || r.Code != tc.code {
					t.Fatalf("ParsePod() error = %v, want a refusal %s", err, tc.code)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParsePod() error = %v", err)
			}
			if tc.want.GPUCount == 0 {
				tc.want.GPUCount = 1
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("ParsePod() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

// TestPeakIsPodRequests checks PeakUnits against kube-scheduler's own
// aggregation (component-helpers' PodRequests) on random pods.
func TestPeakIsPodRequests(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	for range 2000 {
		var inits, cs []corev1.Container
		for i := range rng.Intn(4) {
			c := ctr("i"+string(rune('a'+i)), 0, rng.Int63n(8), rng.Int63n(40))
			if rng.Intn(2) == 0 {
				c = sidecar(c)
			}
			inits = append(inits, c)
		}
		for i := range 1 + rng.Intn(3) {
			cs = append(cs, ctr("c"+string(rune('a'+i)), 0, rng.Int63n(8), rng.Int63n(40)))
		}
		pod := podOf(inits, cs...)
		got, _ := ParsePod(pod)
		reqs := resourcehelper.PodRequests(effective(pod, anyResource), resourcehelper.PodResourcesOptions{})
		want := Units{MemUnits: valueOf(reqs, api.ResourceGPUMemory), Cores: valueOf(reqs, api.ResourceGPUCore)}
		if got.Peak != want {
			t.Fatalf("pod %+v: PeakUnits = %+v, PodRequests = %+v", pod.Spec, got.Peak, want)
		}
	}
}

func valueOf(l corev1.ResourceList, name corev1.ResourceName) int64 {
	q, ok := l[name]
	if !ok {
		return 0
	}
	return q.Value()
}

func TestResolve(t *testing.T) {
	tests := []struct {
		name      string
		c         Container
		unit      int64
		base      int64
		want      Amount
		wantMilli int64
	}{
		{name: "memory units", c: Container{MemUnits: 4, Cores: 20}, unit: 1024, base: 40960, want: Amount{4096, 20}, wantMilli: 200},
		{name: "core-only: cores percent of the base", c: Container{Cores: 25}, unit: 1024, base: 40960, want: Amount{10240, 25}, wantMilli: 250},
		{name: "core-only rounds up", c: Container{Cores: 30}, unit: 1024, base: 39936, want: Amount{11981, 30}, wantMilli: 300},
		{name: "memory-only: no cores", c: Container{MemUnits: 1}, unit: 512, base: 40960, want: Amount{512, 0}, wantMilli: 0},
		{name: "100 cores stays a slice", c: Container{MemUnits: 1, Cores: 100}, unit: 1024, base: 40960, want: Amount{1024, 100}, wantMilli: 999},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := Resolve(tc.c, tc.unit, tc.base)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Resolve() mismatch (-want +got):\n%s", diff)
			}
			if m := CoresToMilli(got.Cores); m != tc.wantMilli {
				t.Errorf("CoresToMilli(%d) = %d, want %d", got.Cores, m, tc.wantMilli)
			}
		})
	}
}

func TestSlicePeak(t *testing.T) {
	cs := []Container{
		{Name: "side", Kind: Sidecar, Cores: 10},            // 4096 MiB at base 40960
		{Name: "init", Kind: Init, MemUnits: 20, Cores: 50}, // alone beside side: 24576, 60
		{Name: "main", MemUnits: 2, Cores: 30},              // with side: 6144, 40
		{Name: "whole", Whole: 1},                           // not a slice
		{Name: "mem", MemUnits: 1},                          // with side and main: 7168, 40
	}
	if got, want := SlicePeak(cs, 1024, 40960), (Amount{MemMiB: 24576, Cores: 60}); got != want {
		t.Errorf("SlicePeak() = %+v, want %+v", got, want)
	}
	cs[1].Kind = Sidecar // now everything runs together
	if got, want := SlicePeak(cs, 1024, 40960), (Amount{MemMiB: 4096 + 20480 + 2048 + 1024, Cores: 90}); got != want {
		t.Errorf("SlicePeak() = %+v, want %+v", got, want)
	}
}

func TestCapacity(t *testing.T) {
	tests := []struct {
		mem, reserve, unit uint64
		units              int64
		want               Amount
	}{
		{mem: 40960, unit: 1024, units: 40, want: Amount{40960, 100}},
		{mem: 40960, reserve: 500, unit: 1024, units: 39, want: Amount{39936, 100}},
		{mem: 16384, reserve: 1024, unit: 1024, units: 15, want: Amount{15360, 100}},
		{mem: 1000, reserve: 1000, unit: 1024, units: 0, want: Amount{0, 100}},
		{mem: 1000, unit: 0, units: 0, want: Amount{0, 100}},
	}
	for _, tc := range tests {
		if got := MemoryUnits(tc.mem, tc.reserve, tc.unit); got != tc.units {
			t.Errorf("MemoryUnits(%d, %d, %d) = %d, want %d", tc.mem, tc.reserve, tc.unit, got, tc.units)
		}
		if got := GPUCapacity(tc.mem, tc.reserve, tc.unit); got != tc.want {
			t.Errorf("GPUCapacity(%d, %d, %d) = %+v, want %+v", tc.mem, tc.reserve, tc.unit, got, tc.want)
		}
	}
	if got := CoreOnlyBaseMiB(40960, 39936, 81920); got != 39936 {
		t.Errorf("CoreOnlyBaseMiB = %d, want the smallest, 39936", got)
	}
	if got := CoreOnlyBaseMiB(); got != 0 {
		t.Errorf("CoreOnlyBaseMiB() = %d, want 0", got)
	}
	if got := UsedCoresToMilli(100); got != 1000 {
		t.Errorf("UsedCoresToMilli(100) = %d, want 1000", got)
	}
}

func TestChecks(t *testing.T) {
	code := func(r *Refusal) Code {
		if r == nil {
			return ""
		}
		return r.Code
	}
	c := Amount{MemMiB: 10240, Cores: 100}
	tests := []struct {
		name string
		got  *Refusal
		want Code
	}{
		{"whole on a free GPU", CheckWhole(GPUUse{}), ""},
		{"whole on a shared GPU", CheckWhole(GPUUse{Shared: true}), CodeGPUServesShared},
		{"slice on a free GPU", CheckShared(GPUUse{}), ""},
		{"slice on a whole GPU", CheckShared(GPUUse{Whole: true}), CodeGPUUsedWhole},
		{"slice fits exactly", FitSlice(c, Amount{5120, 50}, Amount{5120, 50}), ""},
		{"memory over", FitSlice(c, Amount{5120, 0}, Amount{5121, 0}), CodeMemoryOvercommitted},
		{"cores over", FitSlice(c, Amount{0, 90}, Amount{1, 11}), CodeCoresOvercommitted},
		{"100 core devices on one GPU", CheckDevices(api.ResourceGPUCore, 100, 40, 1), ""},
		{"101 core devices on one GPU", CheckDevices(api.ResourceGPUCore, 101, 40, 1), CodeCoresAboveGPU},
		{"101 core devices on two GPUs (a multi-GPU slice)", CheckDevices(api.ResourceGPUCore, 101, 40, 2), ""},
		{"201 core devices on two GPUs", CheckDevices(api.ResourceGPUCore, 201, 40, 2), CodeCoresAboveGPU},
		{"no node-less bound below one GPU", CheckDevices(api.ResourceGPUCore, 100, 40, 0), ""},
		{"memory devices of the largest GPU", CheckDevices(api.ResourceGPUMemory, 40, 40, 1), ""},
		{"memory devices above any GPU", CheckDevices(api.ResourceGPUMemory, 41, 40, 1), CodeSliceTooLarge},
		{"memory devices of four GPUs", CheckDevices(api.ResourceGPUMemory, 160, 40, 4), ""},
		{"memory devices above four GPUs", CheckDevices(api.ResourceGPUMemory, 161, 40, 4), CodeSliceTooLarge},
		{"at most 16 GPUs count", CheckDevices(api.ResourceGPUCore, 1601, 40, 64), CodeCoresAboveGPU},
		{"whole devices are not limited here", CheckDevices(api.ResourceGPU, 8, 40, 1), ""},
		{"container: whole and shared", Container{Whole: 1, Cores: 1}.Check(), CodeWholeAndShared},
		{"container: 101 cores", Container{MemUnits: 1, Cores: 101}.Check(), CodeCoresAboveGPU},
	}
	for _, tc := range tests {
		if got := code(tc.got); got != tc.want {
			t.Errorf("%s: refusal %q (%v), want %q", tc.name, got, tc.got, tc.want)
		}
	}
	r := FitSlice(c, Amount{8192, 0}, Amount{4096, 0})
	if diff := cmp.Diff(&Refusal{Code: CodeMemoryOvercommitted, Used: 8192, Capacity: 10240, Asked: 4096,
		Message: "over-committed: 8192 MiB of its 10240 shared MiB are in use and the slice asks for 4096 MiB"}, r); diff != "" {
		t.Errorf("FitSlice() mismatch (-want +got):\n%s", diff)
	}
}

func TestLifecycle(t *testing.T) {
	now := metav1.NewTime(time.Unix(1, 0))
	tests := []struct {
		name                    string
		phase                   corev1.PodPhase
		deleting                bool
		node                    string
		terminal, ended, onNode bool
	}{
		{name: "running", phase: corev1.PodRunning, node: "n"},
		{name: "pending unbound", phase: corev1.PodPending, onNode: true},
		{name: "succeeded", phase: corev1.PodSucceeded, node: "n", terminal: true, ended: true, onNode: true},
		{name: "failed", phase: corev1.PodFailed, node: "n", terminal: true, ended: true, onNode: true},
		{name: "being deleted", phase: corev1.PodRunning, deleting: true, node: "n", ended: true, onNode: true},
		{name: "bound elsewhere", phase: corev1.PodRunning, node: "m", onNode: true},
	}
	for _, tc := range tests {
		p := &corev1.Pod{Spec: corev1.PodSpec{NodeName: tc.node}, Status: corev1.PodStatus{Phase: tc.phase}}
		if tc.deleting {
			p.DeletionTimestamp = &now
		}
		if Terminal(p) != tc.terminal || Ended(p) != tc.ended || EndedOn(p, "n") != tc.onNode {
			t.Errorf("%s: Terminal, Ended, EndedOn = %v, %v, %v; want %v, %v, %v", tc.name, Terminal(p), Ended(p), EndedOn(p, "n"), tc.terminal, tc.ended, tc.onNode)
		}
	}
}

func TestCheckAssignment(t *testing.T) {
	const uuid = "GPU-11111111-1111-1111-1111-111111111111"
	pod := podOf([]corev1.Container{ctr("init", 1, 0, 0)}, ctr("train", 2, 0, 0), ctr("infer", 0, 4, 30), ctr("core", 0, 0, 20), ctr("mem", 0, 2, 0), ctr("bad", 0, 0, 0))
	pod.Spec.Containers[4] = withQ(pod.Spec.Containers[4], api.ResourceGPUMemory, "0.5")
	ref := api.GPURef{UUID: uuid, Index: 1}
	ref2 := api.GPURef{UUID: uuid[:len(uuid)-1] + "2", Index: 2}
	tests := []struct {
		name string
		c    api.ContainerAssignment
		ok   bool
	}{
		{"whole GPUs asked for", api.ContainerAssignment{Name: "train", GPUs: []api.GPURef{ref}}, true},
		{"init container's GPU", api.ContainerAssignment{Name: "init", GPUs: []api.GPURef{ref}}, true},
		{"more whole GPUs than asked", api.ContainerAssignment{Name: "init", GPUs: []api.GPURef{ref, {UUID: uuid[:len(uuid)-1] + "2", Index: 2}}}, false},
		{"slice", api.ContainerAssignment{Name: "infer", Shared: &api.SharedGPU{GPU: ref, MemoryMiB: 4096, Cores: 30}}, true},
		{"more cores than asked", api.ContainerAssignment{Name: "infer", Shared: &api.SharedGPU{GPU: ref, MemoryMiB: 4096, Cores: 31}}, false},
		{"core-only slice", api.ContainerAssignment{Name: "core", Shared: &api.SharedGPU{GPU: ref, MemoryMiB: 8192, Cores: 20}}, true},
		{"memory-only slice", api.ContainerAssignment{Name: "mem", Shared: &api.SharedGPU{GPU: ref, MemoryMiB: 2048}}, true},
		{"slice to a container asking none", api.ContainerAssignment{Name: "train", Shared: &api.SharedGPU{GPU: ref, MemoryMiB: 1}}, false},
		{"slice to an invalid request", api.ContainerAssignment{Name: "bad", Shared: &api.SharedGPU{GPU: ref, MemoryMiB: 1}}, false},
		{"no such container", api.ContainerAssignment{Name: "ghost", GPUs: []api.GPURef{ref}}, false},
		// A multi-GPU slice: its cores on each GPU times its GPUs.
		{"a slice over two GPUs", api.ContainerAssignment{Name: "infer", Shared: &api.SharedGPU{GPU: ref, Spread: []api.GPURef{ref2}, MemoryMiB: 2048, Cores: 15}}, true},
		{"a slice over two GPUs with more cores than asked", api.ContainerAssignment{Name: "infer", Shared: &api.SharedGPU{GPU: ref, Spread: []api.GPURef{ref2}, MemoryMiB: 2048, Cores: 16}}, false},
		{"a core-only slice over two GPUs", api.ContainerAssignment{Name: "core", Shared: &api.SharedGPU{GPU: ref, Spread: []api.GPURef{ref2}, MemoryMiB: 4096, Cores: 10}}, true},
		{"a core-only slice of its cores on each of two GPUs", api.ContainerAssignment{Name: "core", Shared: &api.SharedGPU{GPU: ref, Spread: []api.GPURef{ref2}, MemoryMiB: 4096, Cores: 20}}, false},
	}
	for _, tc := range tests {
		a := api.NewAssignment()
		a.Containers = []api.ContainerAssignment{tc.c}
		err := CheckAssignment(a, pod)
		if (err == nil) != tc.ok {
			t.Errorf("%s: CheckAssignment() = %v, want ok %v", tc.name, err, tc.ok)
		}
		var r *Refusal
		if err != nil && (!errors.Is(err, api.ErrDisagrees) || !errors.As(err, &r) || r.Code != CodeAssignmentDisagrees || r.Container != tc.c.Name) {
			t.Errorf("%s: CheckAssignment() = %v, want a %s refusal for %q wrapping api.ErrDisagrees", tc.name, err, CodeAssignmentDisagrees, tc.c.Name)
		}
	}
}

func TestGrantSlice(t *testing.T) {
	ref := api.GPURef{UUID: "GPU-1", Index: 1}
	tests := []struct {
		name string
		s    api.SharedGPU
		held Amount
		want api.SharedGPU
		code Code
	}{
		{name: "as held", s: api.SharedGPU{GPU: ref, MemoryMiB: 2048, Cores: 10}, held: Amount{2048, 10}, want: api.SharedGPU{GPU: ref, MemoryMiB: 2048, Cores: 10}},
		{name: "less than held", s: api.SharedGPU{GPU: ref, MemoryMiB: 1024, Cores: 5}, held: Amount{2048, 10}, want: api.SharedGPU{GPU: ref, MemoryMiB: 1024, Cores: 5}},
		{name: "zeros filled in", s: api.SharedGPU{GPU: ref, Cores: 10}, held: Amount{2048, 10}, want: api.SharedGPU{GPU: ref, MemoryMiB: 2048, Cores: 10}},
		{name: "memory-only keeps no cores", s: api.SharedGPU{GPU: ref, MemoryMiB: 2048}, held: Amount{2048, 0}, want: api.SharedGPU{GPU: ref, MemoryMiB: 2048}},
		{name: "too much memory", s: api.SharedGPU{GPU: ref, MemoryMiB: 4096, Cores: 10}, held: Amount{2048, 10}, code: CodeAssignmentDisagrees},
		{name: "too many cores", s: api.SharedGPU{GPU: ref, MemoryMiB: 2048, Cores: 11}, held: Amount{2048, 10}, code: CodeAssignmentDisagrees},
	}
	for _, tc := range tests {
		got, r := GrantSlice(tc.s, tc.held)
		if tc.code != "" {
			if r == nil || r.Code != tc.code {
				t.Errorf("%s: GrantSlice() refusal = %v, want %s", tc.name, r, tc.code)
			}
			continue
		}
		if r != nil {
			t.Errorf("%s: GrantSlice() = %v", tc.name, r)
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("%s: GrantSlice() mismatch (-want +got):\n%s", tc.name, diff)
		}
	}
}

func TestQuotaUse(t *testing.T) {
	nv := ctr("nv", 0, 0, 0)
	nv.Resources.Limits[api.ResourceNVIDIAGPU] = resource.MustParse("2")
	tests := []struct {
		name string
		pod  *corev1.Pod
		want quota.Resources
		code Code
	}{
		{name: "nothing", pod: podOf(nil, ctr("main", 0, 0, 0)), want: quota.Resources{}},
		{name: "slice", pod: podOf(nil, ctr("main", 0, 4, 30)), want: quota.Resources{api.ResourceGPUMemory: 4, api.ResourceGPUCore: 30}},
		{name: "core-only counts its cores", pod: podOf(nil, ctr("main", 0, 0, 30)), want: quota.Resources{api.ResourceGPUCore: 30}},
		{name: "sidecar adds up", pod: podOf([]corev1.Container{sidecar(ctr("side", 1, 0, 0))}, ctr("main", 2, 0, 0)), want: quota.Resources{api.ResourceGPU: 3}},
		{name: "init container: the larger", pod: podOf([]corev1.Container{ctr("init", 4, 0, 0)}, ctr("main", 2, 0, 0)), want: quota.Resources{api.ResourceGPU: 4}},
		{name: "nvidia.com/gpu", pod: podOf(nil, nv), want: quota.Resources{api.ResourceNVIDIAGPU: 2}},
		{name: "refused, still counted rounded up", pod: podOf(nil, withQ(ctr("main", 0, 0, 10), api.ResourceGPUMemory, "1.5")),
			want: quota.Resources{api.ResourceGPUMemory: 2, api.ResourceGPUCore: 10}, code: CodeInvalidQuantity},
	}
	for _, tc := range tests {
		got, err := QuotaUse(tc.pod)
		var r *Refusal
		if tc.code != "" && (!errors.As(err, &r) || r.Code != tc.code) {
			t.Errorf("%s: QuotaUse() error = %v, want %s", tc.name, err, tc.code)
		}
		if tc.code == "" && err != nil {
			t.Errorf("%s: QuotaUse() error = %v", tc.name, err)
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("%s: QuotaUse() mismatch (-want +got):\n%s", tc.name, diff)
		}
	}
}
