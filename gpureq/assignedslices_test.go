package gpureq

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/tessera-gpu/tessera/api"
)

func TestAssignedSlicePeaks(t *testing.T) {
	const g0, g1 = "GPU-0", "GPU-1"
	const gib = 1024
	// share is a container's slice of memGiB and cores on the GPUs uuids.
	share := func(name string, memGiB, cores int64, uuids ...string) api.ContainerAssignment {
		s := &api.SharedGPU{GPU: api.GPURef{UUID: uuids[0]}, MemoryMiB: memGiB * gib, Cores: cores}
		for i, u := range uuids[1:] {
			s.Spread = append(s.Spread, api.GPURef{UUID: u, Index: i + 1})
		}
		return api.ContainerAssignment{Name: name, Shared: s}
	}
	assign := func(cs ...api.ContainerAssignment) *api.Assignment {
		a := api.NewAssignment()
		a.Containers = cs
		return a
	}
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		a    *api.Assignment
		want map[string]Amount
	}{
		{
			name: "no assignment",
			pod:  podOf(nil, ctr("main", 0, 30, 60)),
			want: nil,
		},
		{
			name: "one container",
			pod:  podOf(nil, ctr("main", 0, 30, 60)),
			a:    assign(share("main", 30, 60, g0)),
			want: map[string]Amount{g0: {30 * gib, 60}},
		},
		{
			// The tester's pod: 30 GiB/60 % before main starts, then 30
			// GiB/60 %: never 60 GiB/120 %.
			name: "init container and main: the larger",
			pod:  podOf([]corev1.Container{ctr("init", 0, 30, 60)}, ctr("main", 0, 30, 60)),
			a:    assign(share("init", 30, 60, g0), share("main", 30, 60, g0)),
			want: map[string]Amount{g0: {30 * gib, 60}},
		},
		{
			name: "init container larger than main",
			pod:  podOf([]corev1.Container{ctr("init", 0, 30, 20)}, ctr("main", 0, 10, 60)),
			a:    assign(share("init", 30, 20, g0), share("main", 10, 60, g0)),
			want: map[string]Amount{g0: {30 * gib, 60}},
		},
		{
			name: "native sidecar and main run together: the sum",
			pod:  podOf([]corev1.Container{sidecar(ctr("proxy", 0, 10, 30))}, ctr("main", 0, 20, 60)),
			a:    assign(share("main", 20, 60, g0), share("proxy", 10, 30, g0)),
			want: map[string]Amount{g0: {30 * gib, 90}},
		},
		{
			name: "several init containers: the largest, not their sum",
			pod: podOf([]corev1.Container{ctr("fetch", 0, 8, 10), ctr("convert", 0, 24, 40), ctr("warm", 0, 16, 80)},
				ctr("main", 0, 12, 30)),
			a:    assign(share("convert", 24, 40, g0), share("fetch", 8, 10, g0), share("main", 12, 30, g0), share("warm", 16, 80, g0)),
			want: map[string]Amount{g0: {24 * gib, 80}},
		},
		{
			// The assignment lists containers by name; the peak takes them
			// in start order: the sidecar runs beside the init container
			// that starts after it (10+30 GiB), which name order would
			// miss (30 GiB).
			name: "sidecar started before an init container, listed after it",
			pod: podOf([]corev1.Container{sidecar(ctr("b-proxy", 0, 10, 20)), ctr("a-init", 0, 30, 60)},
				ctr("main", 0, 10, 20)),
			a:    assign(share("a-init", 30, 60, g0), share("b-proxy", 10, 20, g0), share("main", 10, 20, g0)),
			want: map[string]Amount{g0: {40 * gib, 80}},
		},
		{
			name: "slices on two GPUs: each GPU's own peak",
			pod:  podOf([]corev1.Container{ctr("init", 0, 30, 60)}, ctr("main", 0, 10, 20), ctr("other", 0, 5, 10)),
			a:    assign(share("init", 30, 60, g0), share("main", 10, 20, g0), share("other", 5, 10, g1)),
			want: map[string]Amount{g0: {30 * gib, 60}, g1: {5 * gib, 10}},
		},
		{
			name: "a multi-GPU slice with an init container's: the peak on each GPU",
			pod:  counted(podOf([]corev1.Container{ctr("init", 0, 30, 60)}, ctr("main", 0, 40, 80)), "2"),
			a:    assign(share("init", 30, 60, g0), share("main", 20, 40, g0, g1)),
			want: map[string]Amount{g0: {30 * gib, 60}, g1: {20 * gib, 40}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, AssignedSlicePeaks(tc.pod, tc.a)); diff != "" {
				t.Errorf("AssignedSlicePeaks (-want +got):\n%s", diff)
			}
		})
	}
}

func TestStartIndex(t *testing.T) {
	p := podOf([]corev1.Container{ctr("z-init", 0, 1, 0), sidecar(ctr("a-side", 0, 1, 0))}, ctr("b", 0, 1, 0), ctr("a", 0, 1, 0))
	for name, want := range map[string]int{"z-init": 0, "a-side": 1, "b": 2, "a": 3, "absent": 4} {
		if got := StartIndex(p, name); got != want {
			t.Errorf("StartIndex(%q) = %d, want %d", name, got, want)
		}
	}
}
