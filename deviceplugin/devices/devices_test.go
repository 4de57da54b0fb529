package devices_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/deviceplugin/devices"
	"github.com/tessera-gpu/tessera/gpureq"
)

func uuid(i int) string { return fmt.Sprintf("GPU-%08d-0000-0000-0000-000000000000", i) }

// gpus builds n GPUs of memMiB each, the first half on NUMA node 0.
func gpus(n int, memMiB uint64) []devices.GPU {
	var out []devices.GPU
	for i := 0; i < n; i++ {
		out = append(out, devices.GPU{Index: i, UUID: uuid(i), NUMANode: i * 2 / n, MemoryMiB: memMiB})
	}
	return out
}

func opts(mutate ...func(*devices.Options)) devices.Options {
	o := devices.Options{Resources: api.Resources(), MemoryUnitMiB: 1024}
	for _, m := range mutate {
		m(&o)
	}
	return o
}

func mustModel(t testing.TB, g []devices.GPU, o devices.Options) *devices.Model {
	t.Helper()
	m, err := devices.New(g, o)
	if err != nil {
		t.Fatalf("devices.New: %v", err)
	}
	return m
}

func set(uuids ...string) map[string]bool {
	m := map[string]bool{}
	for _, u := range uuids {
		m[u] = true
	}
	return m
}

func TestDeviceCounts(t *testing.T) {
	for _, tc := range []struct {
		name    string
		gpus    []devices.GPU
		opts    devices.Options
		want    map[corev1.ResourceName]int
		wantIDs map[corev1.ResourceName][]string // first and last ID
	}{
		{
			name: "dgx-a100 defaults",
			gpus: gpus(8, 40960),
			opts: opts(),
			want: map[corev1.ResourceName]int{api.ResourceGPU: 8, api.ResourceGPUMemory: 320, api.ResourceGPUCore: 800},
			wantIDs: map[corev1.ResourceName][]string{
				api.ResourceGPU:       {uuid(0), uuid(7)},
				api.ResourceGPUMemory: {uuid(0) + "::mem::0", uuid(7) + "::mem::39"},
				api.ResourceGPUCore:   {uuid(0) + "::core::0", uuid(7) + "::core::99"},
			},
		},
		{
			name: "reserve and half-GiB units",
			gpus: gpus(2, 40960),
			opts: opts(func(o *devices.Options) { o.MemoryReserveMiB = 1500; o.MemoryUnitMiB = 512 }),
			// (40960-1500)/512 = 77.07: 77 units per GPU.
			want: map[corev1.ResourceName]int{api.ResourceGPU: 2, api.ResourceGPUMemory: 154, api.ResourceGPUCore: 200},
		},
		{
			name: "gpu only",
			gpus: gpus(4, 16384),
			opts: opts(func(o *devices.Options) { o.Resources = []corev1.ResourceName{api.ResourceGPU} }),
			want: map[corev1.ResourceName]int{api.ResourceGPU: 4},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := mustModel(t, tc.gpus, tc.opts)
			got := map[corev1.ResourceName]int{}
			for _, r := range api.Resources() {
				ds := m.Devices(r, nil, devices.Usage{})
				if len(ds) > 0 {
					got[r] = len(ds)
				}
				for _, d := range ds {
					if !d.Healthy || d.Reason != "" {
						t.Errorf("%s device %s: healthy %v reason %q, want healthy", r, d.ID, d.Healthy, d.Reason)
					}
					if len(d.ID) > devices.MaxDeviceIDLength {
						t.Errorf("device ID %q is longer than %d", d.ID, devices.MaxDeviceIDLength)
					}
				}
				if ids := tc.wantIDs[r]; ids != nil {
					if first, last := ds[0].ID, ds[len(ds)-1].ID; first != ids[0] || last != ids[1] {
						t.Errorf("%s IDs run %s .. %s, want %s .. %s", r, first, last, ids[0], ids[1])
					}
				}
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("device counts (-want +got):\n%s", diff)
			}
		})
	}
}

func TestNewErrors(t *testing.T) {
	dup := gpus(2, 1024)
	dup[1].UUID = dup[0].UUID
	for _, tc := range []struct {
		name string
		gpus []devices.GPU
		opts devices.Options
		want string
	}{
		{"zero unit", gpus(1, 1024), opts(func(o *devices.Options) { o.MemoryUnitMiB = 0 }), "memory unit"},
		{"reserve eats all", gpus(1, 1024), opts(func(o *devices.Options) { o.MemoryReserveMiB = 1024 }), "leaves nothing"},
		{"duplicate uuid", dup, opts(), "also another GPU's"},
		{"bad uuid", []devices.GPU{{UUID: "a::b", MemoryMiB: 1024}}, opts(), "cannot be a device ID"},
		{"foreign resource", gpus(1, 1024), opts(func(o *devices.Options) { o.Resources = []corev1.ResourceName{"nvidia.com/gpu"} }), "not a Tessera resource"},
		{"id too long", []devices.GPU{{UUID: "GPU-" + strings.Repeat("a", 50), MemoryMiB: 1024}}, opts(), "longer than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := devices.New(tc.gpus, tc.opts)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New error = %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestParseDeviceID(t *testing.T) {
	for _, tc := range []struct {
		r       corev1.ResourceName
		id      string
		uuid    string
		n       int
		wantErr string
	}{
		{api.ResourceGPU, uuid(3), uuid(3), 0, ""},
		{api.ResourceGPUMemory, uuid(3) + "::mem::17", uuid(3), 17, ""},
		{api.ResourceGPUCore, uuid(3) + "::core::99", uuid(3), 99, ""},
		{api.ResourceGPU, uuid(3) + "::mem::1", "", 0, "want a GPU UUID"},
		{api.ResourceGPUMemory, uuid(3) + "::core::1", "", 0, "want <uuid>::mem::<n>"},
		// Found by FuzzParseDeviceID: the part before the first separator
		// was taken for a UUID although it holds another one.
		{api.ResourceGPUMemory, uuid(3) + "::core::1::mem::2", "", 0, "want <uuid>::mem::<n>"},
		{api.ResourceGPUCore, "::mem::0::core::1", "", 0, "want <uuid>::core::<n>"},
		{api.ResourceGPUMemory, uuid(3) + "::mem::x", "", 0, "not a number"},
		{api.ResourceGPUMemory, uuid(3) + "::mem::-1", "", 0, "not a number"},
		{api.ResourceGPUMemory, uuid(3) + "::mem::01", "", 0, "not a number"},
		{"nvidia.com/gpu", uuid(3), "", 0, "not a Tessera resource"},
	} {
		t.Run(tc.id, func(t *testing.T) {
			u, n, err := devices.ParseDeviceID(tc.r, tc.id)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("ParseDeviceID error = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || u != tc.uuid || n != tc.n {
				t.Fatalf("ParseDeviceID = %q, %d, %v; want %q, %d", u, n, err, tc.uuid, tc.n)
			}
			if back := devices.DeviceID(tc.r, u, n); back != tc.id {
				t.Errorf("DeviceID round trip = %q, want %q", back, tc.id)
			}
		})
	}
}

func TestLookup(t *testing.T) {
	m := mustModel(t, gpus(2, 4096), opts())
	if g, err := m.Lookup(api.ResourceGPUMemory, uuid(1)+"::mem::3"); err != nil || g.Index != 1 {
		t.Errorf("Lookup(mem 3 of GPU 1) = %+v, %v", g, err)
	}
	for _, tc := range []struct {
		r        corev1.ResourceName
		id, want string
	}{
		{api.ResourceGPUMemory, uuid(1) + "::mem::4", "has only 4 units"},
		{api.ResourceGPU, uuid(9), "no GPU"},
		{api.ResourceGPUCore, uuid(0) + "::core::100", "has only 100 units"},
	} {
		if _, err := m.Lookup(tc.r, tc.id); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Lookup(%s) error = %v, want %q", tc.id, err, tc.want)
		}
	}
	gpuOnly := mustModel(t, gpus(1, 4096), opts(func(o *devices.Options) { o.Resources = []corev1.ResourceName{api.ResourceGPU} }))
	if _, err := gpuOnly.Lookup(api.ResourceGPUCore, uuid(0)+"::core::0"); err == nil || !strings.Contains(err.Error(), "not advertised") {
		t.Errorf("Lookup of a disabled resource = %v, want 'not advertised'", err)
	}
}

// healthOf summarises Devices as GPU index -> "healthy" or the reason, for
// one resource; every device of a GPU must agree.
func healthOf(t *testing.T, m *devices.Model, r corev1.ResourceName, h devices.HealthMap, u devices.Usage) map[int]string {
	t.Helper()
	out := map[int]string{}
	for _, d := range m.Devices(r, h, u) {
		g, _ := m.GPU(d.GPU)
		s := "healthy"
		if !d.Healthy {
			s = d.Reason
		}
		if prev, ok := out[g.Index]; ok && prev != s {
			t.Fatalf("%s devices of GPU %d disagree: %q and %q", r, g.Index, prev, s)
		}
		out[g.Index] = s
	}
	return out
}

func TestWithholding(t *testing.T) {
	m := mustModel(t, gpus(4, 2048), opts())
	for _, tc := range []struct {
		name      string
		health    devices.HealthMap
		usage     devices.Usage
		wantGPU   map[int]string
		wantUnits map[int]string
	}{
		{
			name:      "idle",
			wantGPU:   map[int]string{0: "healthy", 1: "healthy", 2: "healthy", 3: "healthy"},
			wantUnits: map[int]string{0: "healthy", 1: "healthy", 2: "healthy", 3: "healthy"},
		},
		{
			name:      "whole GPU 1, shared GPU 2",
			usage:     devices.Usage{Whole: set(uuid(1)), Shared: set(uuid(2))},
			wantGPU:   map[int]string{0: "healthy", 1: "healthy", 2: devices.ReasonSharedInUse, 3: "healthy"},
			wantUnits: map[int]string{0: "healthy", 1: devices.ReasonWholeInUse, 2: "healthy", 3: "healthy"},
		},
		{
			name:      "unhealthy beats withheld",
			health:    devices.HealthMap{uuid(1): {Reason: "XID 79"}, uuid(3): {Reason: "GPU lost"}},
			usage:     devices.Usage{Whole: set(uuid(1))},
			wantGPU:   map[int]string{0: "healthy", 1: "XID 79", 2: "healthy", 3: "GPU lost"},
			wantUnits: map[int]string{0: "healthy", 1: "XID 79", 2: "healthy", 3: "GPU lost"},
		},
		{
			name:      "assigned to a slice not admitted yet: only the whole GPU is withheld",
			usage:     devices.Usage{Assigned: set(uuid(3)), Shared: set(uuid(2))},
			wantGPU:   map[int]string{0: "healthy", 1: "healthy", 2: devices.ReasonSharedInUse, 3: devices.ReasonAssigned},
			wantUnits: map[int]string{0: "healthy", 1: "healthy", 2: "healthy", 3: "healthy"},
		},
		{
			name:      "conflict withholds both",
			usage:     devices.Usage{Whole: set(uuid(0)), Shared: set(uuid(0))},
			wantGPU:   map[int]string{0: devices.ReasonSharedInUse, 1: "healthy", 2: "healthy", 3: "healthy"},
			wantUnits: map[int]string{0: devices.ReasonWholeInUse, 1: "healthy", 2: "healthy", 3: "healthy"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.wantGPU, healthOf(t, m, api.ResourceGPU, tc.health, tc.usage)); diff != "" {
				t.Errorf("gpu health (-want +got):\n%s", diff)
			}
			for _, r := range []corev1.ResourceName{api.ResourceGPUMemory, api.ResourceGPUCore} {
				if diff := cmp.Diff(tc.wantUnits, healthOf(t, m, r, tc.health, tc.usage)); diff != "" {
					t.Errorf("%s health (-want +got):\n%s", r, diff)
				}
			}
		})
	}
}

func TestUsageOf(t *testing.T) {
	m := mustModel(t, gpus(4, 2048), opts())
	for _, tc := range []struct {
		name    string
		allocs  []devices.Allocation
		want    devices.Usage
		wantErr int
	}{
		{"none", nil, devices.Usage{Whole: set(), Shared: set()}, 0},
		{
			name: "whole and nominal shared",
			allocs: []devices.Allocation{
				{Resource: api.ResourceGPU, DeviceIDs: []string{uuid(0), uuid(3)}},
				{Resource: api.ResourceGPUMemory, DeviceIDs: []string{uuid(1) + "::mem::0", uuid(1) + "::mem::1"}},
				{Resource: api.ResourceGPUCore, DeviceIDs: []string{uuid(2) + "::core::5"}},
			},
			want: devices.Usage{Whole: set(uuid(0), uuid(3)), Shared: set(uuid(1), uuid(2))},
		},
		{
			name: "assignment overrides the nominal GPU",
			allocs: []devices.Allocation{
				{Resource: api.ResourceGPUMemory, DeviceIDs: []string{uuid(1) + "::mem::0"}, SharedGPU: uuid(2)},
			},
			want: devices.Usage{Whole: set(), Shared: set(uuid(2))},
		},
		{
			name: "a multi-GPU slice's assignment: each of its GPUs",
			allocs: []devices.Allocation{
				{Resource: api.ResourceGPUMemory, DeviceIDs: []string{uuid(1) + "::mem::0", uuid(1) + "::mem::1"}, SharedGPU: uuid(2) + "," + uuid(3)},
			},
			want: devices.Usage{Whole: set(), Shared: set(uuid(2), uuid(3))},
		},
		{
			name: "a multi-GPU slice with a foreign GPU: an error, the nominal GPUs count",
			allocs: []devices.Allocation{
				{Resource: api.ResourceGPUMemory, DeviceIDs: []string{uuid(1) + "::mem::0"}, SharedGPU: uuid(2) + "," + uuid(9)},
			},
			want:    devices.Usage{Whole: set(), Shared: set(uuid(1))},
			wantErr: 1,
		},
		{
			name: "foreign devices are errors, others still count",
			allocs: []devices.Allocation{
				{Resource: api.ResourceGPU, DeviceIDs: []string{uuid(9), uuid(1)}},
				{Resource: api.ResourceGPUCore, DeviceIDs: []string{"junk"}},
				{Resource: api.ResourceGPUMemory, DeviceIDs: []string{uuid(3) + "::mem::0"}, SharedGPU: uuid(8)},
				{Resource: "nvidia.com/gpu", DeviceIDs: []string{"x"}},
			},
			want:    devices.Usage{Whole: set(uuid(1)), Shared: set(uuid(3))},
			wantErr: 3,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, errs := m.UsageOf(tc.allocs)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("usage (-want +got):\n%s", diff)
			}
			if len(errs) != tc.wantErr {
				t.Errorf("errors = %v, want %d", errs, tc.wantErr)
			}
		})
	}
}

func TestCheckWhole(t *testing.T) {
	m := mustModel(t, gpus(5, 2048), opts())
	health := devices.HealthMap{uuid(2): {Reason: "XID 48"}}
	usage := devices.Usage{Shared: set(uuid(3)), Whole: set(uuid(1)), Assigned: set(uuid(4))}
	got, err := m.CheckWhole([]string{uuid(1), uuid(0)}, health, usage)
	if err != nil {
		t.Fatalf("CheckWhole(0, 1) = %v", err)
	}
	if diff := cmp.Diff([]int{0, 1}, []int{got[0].Index, got[1].Index}); diff != "" {
		t.Errorf("CheckWhole order (-want +got):\n%s", diff)
	}
	for _, tc := range []struct {
		ids  []string
		want string
	}{
		{nil, "no tessera.dev/gpu devices"},
		{[]string{uuid(2)}, "is unhealthy: XID 48"},
		{[]string{uuid(3)}, "serves shared units"},
		{[]string{uuid(4)}, "assigned to shared units of a pod on this node"},
		{[]string{uuid(0), uuid(0)}, "requested twice"},
		{[]string{uuid(7)}, "no GPU"},
	} {
		if _, err := m.CheckWhole(tc.ids, health, usage); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("CheckWhole(%v) error = %v, want %q", tc.ids, err, tc.want)
		}
	}
}

func TestCheckShared(t *testing.T) {
	m := mustModel(t, gpus(2, 2048), opts())
	if err := m.CheckShared(api.ResourceGPUMemory, []string{uuid(0) + "::mem::0", uuid(1) + "::mem::1"}); err != nil {
		t.Errorf("CheckShared(valid) = %v", err)
	}
	for _, tc := range []struct {
		r    corev1.ResourceName
		ids  []string
		want string
	}{
		{api.ResourceGPU, []string{uuid(0)}, "not a shared resource"},
		{api.ResourceGPUCore, nil, "no tessera.dev/gpu-core devices"},
		{api.ResourceGPUCore, []string{uuid(0) + "::mem::0"}, "want <uuid>::core::<n>"},
		{api.ResourceGPUCore, []string{uuid(0) + "::core::1", uuid(0) + "::core::1"}, "requested twice"},
	} {
		if err := m.CheckShared(tc.r, tc.ids); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("CheckShared(%s %v) error = %v, want %q", tc.r, tc.ids, err, tc.want)
		}
	}

	// The slice rules Allocate can see (gpureq.CheckDevices): Allocate
	// does not know the pod's GPU count, so at most the cores and memory
	// the node's two GPUs share together (a slice may span both).
	units := func(r corev1.ResourceName, n int) []string {
		var ids []string
		for i := range n {
			ids = append(ids, devices.DeviceID(r, uuid(i/m.Units(r, devices.GPU{MemoryMiB: 2048})), i%m.Units(r, devices.GPU{MemoryMiB: 2048})))
		}
		return ids
	}
	for _, tc := range []struct {
		r    corev1.ResourceName
		n    int
		want gpureq.Code
	}{
		{api.ResourceGPUCore, 100, ""},
		{api.ResourceGPUCore, 200, ""},
		{api.ResourceGPUCore, 201, gpureq.CodeCoresAboveGPU},
		{api.ResourceGPUMemory, 4, ""},
		{api.ResourceGPUMemory, 5, gpureq.CodeSliceTooLarge},
	} {
		err := m.CheckShared(tc.r, units(tc.r, tc.n))
		var ref *gpureq.Refusal
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("CheckShared(%d %s) = %v", tc.n, tc.r, err)
		case tc.want != "" && (!errors.As(err, &ref) || ref.Code != tc.want):
			t.Errorf("CheckShared(%d %s) = %v, want a %s refusal", tc.n, tc.r, err, tc.want)
		}
	}
}
