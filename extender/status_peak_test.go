package extender

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/extender/internal/testbuild"
)

// TestStatusSlicePeak: the views count a pod's slices of a GPU at the
// pod's peak, as the fit does (an init container's slice is gone once the
// app containers run; a native sidecar runs beside them): the occupancy
// (status, /status/occupancy), the slice memory metric and the ledger
// lines of explain (/status/pods). The tester's pod, init 30 GiB/60 % and
// main 30 GiB/60 % on a 40 GB A100, showed 60 GiB and 120 %.
func TestStatusSlicePeak(t *testing.T) {
	const gib = 1024
	type ctr struct {
		name          string
		sidecar       bool
		memGiB, cores int64
	}
	build := func(inits, mains []ctr) *corev1.Pod {
		b := testbuild.Pod("p").Node("a")
		b.Pod.Spec.Containers = nil
		b.Assign = api.NewAssignment()
		spec := func(c ctr) corev1.Container {
			out := corev1.Container{Name: c.name, Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
				api.ResourceGPUMemory: *resource.NewQuantity(c.memGiB, resource.DecimalSI),
				api.ResourceGPUCore:   *resource.NewQuantity(c.cores, resource.DecimalSI),
			}}}
			if c.sidecar {
				always := corev1.ContainerRestartPolicyAlways
				out.RestartPolicy = &always
			}
			b.Assign.Containers = append(b.Assign.Containers, api.ContainerAssignment{Name: c.name,
				Shared: &api.SharedGPU{GPU: api.GPURef{UUID: testbuild.GPUUUID("a", 0), Index: 0}, MemoryMiB: c.memGiB * gib, Cores: c.cores}})
			return out
		}
		for _, c := range inits {
			b.Pod.Spec.InitContainers = append(b.Pod.Spec.InitContainers, spec(c))
		}
		for _, c := range mains {
			b.Pod.Spec.Containers = append(b.Pod.Spec.Containers, spec(c))
		}
		// The node agent writes the assignment's containers by name.
		p := b.Obj()
		p.Status.Phase = corev1.PodRunning
		return p
	}
	gpu0 := "GPU 0 (A100-SXM4-40GB, " + testbuild.GPUUUID("a", 0) + ")"
	for _, tc := range []struct {
		name                string
		inits, mains        []ctr
		wantMemMiB, wantPct int64
		wantLedger          []string
	}{
		{
			name:  "init container and main",
			inits: []ctr{{name: "init", memGiB: 30, cores: 60}}, mains: []ctr{{name: "main", memGiB: 30, cores: 60}},
			wantMemMiB: 30 * gib, wantPct: 60,
			wantLedger: []string{gpu0 + ": 30720 MiB, 60% compute at the pod's peak (init container init: 30720 MiB, 60%; container main: 30720 MiB, 60%; an init container's slice counts only until it ends)"},
		},
		{
			name:  "native sidecar and main",
			inits: []ctr{{name: "proxy", sidecar: true, memGiB: 10, cores: 30}}, mains: []ctr{{name: "main", memGiB: 20, cores: 60}},
			wantMemMiB: 30 * gib, wantPct: 90,
			wantLedger: []string{gpu0 + ": 30720 MiB, 90% compute at the pod's peak (sidecar proxy: 10240 MiB, 30%; container main: 20480 MiB, 60%)"},
		},
		{
			name:  "several init containers",
			inits: []ctr{{name: "fetch", memGiB: 8, cores: 10}, {name: "convert", memGiB: 24, cores: 40}}, mains: []ctr{{name: "main", memGiB: 12, cores: 30}},
			wantMemMiB: 24 * gib, wantPct: 40,
			wantLedger: []string{gpu0 + ": 24576 MiB, 40% compute at the pod's peak (init container fetch: 8192 MiB, 10%; init container convert: 24576 MiB, 40%; container main: 12288 MiB, 30%; an init container's slice counts only until it ends)"},
		},
		{
			name:  "a sidecar started before an init container (listed after it by name)",
			inits: []ctr{{name: "b-proxy", sidecar: true, memGiB: 10, cores: 20}, {name: "a-init", memGiB: 25, cores: 60}}, mains: []ctr{{name: "main", memGiB: 10, cores: 20}},
			wantMemMiB: 35 * gib, wantPct: 80,
			wantLedger: []string{gpu0 + ": 35840 MiB, 80% compute at the pod's peak (sidecar b-proxy: 10240 MiB, 20%; init container a-init: 25600 MiB, 60%; container main: 10240 MiB, 20%; an init container's slice counts only until it ends)"},
		},
		{
			name:       "one container",
			mains:      []ctr{{name: "main", memGiB: 16, cores: 30}},
			wantMemMiB: 16 * gib, wantPct: 30,
			wantLedger: []string{gpu0 + ": 16384 MiB, 30% compute (container main)"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nodes := []*corev1.Node{testbuild.Node("a").GPUs(2, "NVIDIA A100-SXM4-40GB", 40960).Obj()}
			pods := []*corev1.Pod{build(tc.inits, tc.mains)}
			s := NewStatus(newTestCache(t, nodes, pods), nil, nil, func() ([]*corev1.Pod, error) { return pods, nil })
			snap := take(t, s)

			g := OccupancyView(snap).Nodes[0].GPUs[0]
			if g.MemoryUsedMiB != tc.wantMemMiB || g.Cores != tc.wantPct || g.Use() != "shared" {
				t.Errorf("occupancy of GPU 0: %s %d MiB %d%%, want shared %d MiB %d%%", g.Use(), g.MemoryUsedMiB, g.Cores, tc.wantMemMiB, tc.wantPct)
			}
			// The fit's ledger counts the same.
			if st := snap.Nodes["a"].GPUs[0]; st.MemUsedMiB != tc.wantMemMiB || st.CoresUsed != tc.wantPct {
				t.Errorf("ledger of GPU 0: %d MiB %d%%, want %d MiB %d%%", st.MemUsedMiB, st.CoresUsed, tc.wantMemMiB, tc.wantPct)
			}

			reg := prometheus.NewPedanticRegistry()
			reg.MustRegister(s.Collector())
			families, err := reg.Gather()
			if err != nil {
				t.Fatal(err)
			}
			found := false
			for _, f := range families {
				if f.GetName() != "tessera_extender_gpu_slice_memory_used_bytes" {
					continue
				}
				for _, m := range f.GetMetric() {
					found = true
					if v := m.GetGauge().GetValue(); v != float64(tc.wantMemMiB<<20) {
						t.Errorf("tessera_extender_gpu_slice_memory_used_bytes%s = %v, want %v", labelString(m), v, float64(tc.wantMemMiB<<20))
					}
				}
			}
			if !found {
				t.Error("no tessera_extender_gpu_slice_memory_used_bytes")
			}

			pv := PodView(snap, "default", "p")
			if pv == nil {
				t.Fatal("PodView: nil")
			}
			if diff := cmp.Diff(tc.wantLedger, pv.GPUs); diff != "" {
				t.Errorf("ledger lines (-want +got):\n%s", diff)
			}
			if strings.Contains(strings.Join(pv.GPUs, "\n"), "%!") {
				t.Errorf("ledger lines misformatted: %q", pv.GPUs)
			}
		})
	}
}
