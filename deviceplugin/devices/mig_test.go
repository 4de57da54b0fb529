package devices_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/deviceplugin/devices"
)

func migUUID(gpu, start int) string { return fmt.Sprintf("MIG-%08d-0000-0000-0000-%012d", gpu, start) }

var (
	mig1g = api.MIGResource("1g.5gb")
	mig2g = api.MIGResource("2g.10gb")
	mig3g = api.MIGResource("3g.20gb")
)

// migGPUs is 4 GPUs of 40 GiB: GPU 0 in 7 x 1g.5gb, GPU 1 in 3g.20gb +
// 2g.10gb + 1g.5gb, GPU 2 in MIG mode with no instance, GPU 3 whole.
func migGPUs() []devices.GPU {
	g := gpus(4, 40960)
	g[0].MIGMode = true
	for s := 0; s < 7; s++ {
		g[0].MIG = append(g[0].MIG, devices.MIGInstance{UUID: migUUID(0, s), Profile: "1g.5gb", Start: s, Size: 1})
	}
	g[1].MIGMode = true
	g[1].MIG = []devices.MIGInstance{
		{UUID: migUUID(1, 6), Profile: "1g.5gb", Start: 6, Size: 1}, // out of order: the model sorts
		{UUID: migUUID(1, 0), Profile: "3g.20gb", Start: 0, Size: 4},
		{UUID: migUUID(1, 4), Profile: "2g.10gb", Start: 4, Size: 2},
	}
	g[2].MIGMode = true
	return g
}

func migOpts() devices.Options {
	return opts(func(o *devices.Options) {
		o.Resources = append(o.Resources, mig1g, mig2g, mig3g)
	})
}

func TestMIGDevices(t *testing.T) {
	m := mustModel(t, migGPUs(), migOpts())
	ids := func(r corev1.ResourceName) []string {
		var out []string
		for _, d := range m.Devices(r, nil, devices.Usage{}) {
			out = append(out, fmt.Sprintf("%s@%d", d.ID, d.NUMANode))
			if d.GPU == "" || !d.Healthy {
				t.Errorf("%s device %+v", r, d)
			}
		}
		return out
	}
	want := map[corev1.ResourceName][]string{
		mig1g: {migUUID(0, 0) + "@0", migUUID(0, 1) + "@0", migUUID(0, 2) + "@0", migUUID(0, 3) + "@0", migUUID(0, 4) + "@0", migUUID(0, 5) + "@0", migUUID(0, 6) + "@0", migUUID(1, 6) + "@0"},
		mig2g: {migUUID(1, 4) + "@0"},
		mig3g: {migUUID(1, 0) + "@0"},
		// A GPU in MIG mode offers nothing whole or sliced.
		api.ResourceGPU: {uuid(3) + "@1"},
	}
	for r, w := range want {
		if diff := cmp.Diff(w, ids(r)); diff != "" {
			t.Errorf("%s devices (-want +got):\n%s", r, diff)
		}
	}
	if n := len(m.Devices(api.ResourceGPUMemory, nil, devices.Usage{})); n != 40 {
		t.Errorf("%d memory units, want 40 (GPU 3's only)", n)
	}
	if n := len(m.Devices(api.ResourceGPUCore, nil, devices.Usage{})); n != 100 {
		t.Errorf("%d core units, want 100 (GPU 3's only)", n)
	}
	if diff := cmp.Diff([]corev1.ResourceName{mig1g, mig2g, mig3g}, devices.MIGResources(migGPUs())); diff != "" {
		t.Errorf("MIGResources (-want +got):\n%s", diff)
	}
}

func TestMIGLookupAndCheck(t *testing.T) {
	m := mustModel(t, migGPUs(), migOpts())
	unhealthy := devices.HealthMap{uuid(1): {Reason: "XID 79"}}
	tests := []struct {
		name    string
		r       corev1.ResourceName
		ids     []string
		health  devices.HealthMap
		want    []string // MIG UUIDs, ordered
		wantErr string
	}{
		{name: "one", r: mig1g, ids: []string{migUUID(0, 3)}, want: []string{migUUID(0, 3)}},
		{name: "ordered by GPU and start", r: mig1g, ids: []string{migUUID(1, 6), migUUID(0, 5), migUUID(0, 1)}, want: []string{migUUID(0, 1), migUUID(0, 5), migUUID(1, 6)}},
		{name: "other profile", r: mig2g, ids: []string{migUUID(0, 3)}, wantErr: "is a 1g.5gb, not a 2g.10gb"},
		{name: "unknown", r: mig1g, ids: []string{migUUID(7, 0)}, wantErr: "no such MIG instance"},
		{name: "GPU UUID", r: mig1g, ids: []string{uuid(0)}, wantErr: "no such MIG instance"},
		{name: "twice", r: mig1g, ids: []string{migUUID(0, 3), migUUID(0, 3)}, wantErr: "requested twice"},
		{name: "none", r: mig1g, wantErr: "no tessera.dev/mig-1g.5gb devices"},
		{name: "unhealthy parent", r: mig3g, ids: []string{migUUID(1, 0)}, health: unhealthy, wantErr: "unhealthy: XID 79"},
		{name: "other GPU's health does not matter", r: mig1g, ids: []string{migUUID(0, 0)}, health: unhealthy, want: []string{migUUID(0, 0)}},
		{name: "not advertised", r: api.MIGResource("7g.40gb"), ids: []string{migUUID(0, 0)}, wantErr: "not advertised"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := m.CheckMIG(tc.r, tc.ids, tc.health)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("CheckMIG = %v, want error containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var uuids []string
			for _, a := range got {
				uuids = append(uuids, a.Instance.UUID)
				if g, _ := m.Lookup(tc.r, a.Instance.UUID); g.UUID != a.GPU.UUID {
					t.Errorf("Lookup(%s) = GPU %s, CheckMIG says %s", a.Instance.UUID, g.UUID, a.GPU.UUID)
				}
			}
			if diff := cmp.Diff(tc.want, uuids); diff != "" {
				t.Errorf("CheckMIG (-want +got):\n%s", diff)
			}
		})
	}
	// Whole GPUs and units of a GPU in MIG mode do not exist.
	if _, err := m.Lookup(api.ResourceGPU, uuid(0)); err == nil || !strings.Contains(err.Error(), "MIG mode") {
		t.Errorf("Lookup(gpu, GPU 0 in MIG mode) = %v, want a MIG mode error", err)
	}
	if _, err := m.CheckWhole([]string{uuid(2)}, nil, devices.Usage{}); err == nil {
		t.Error("CheckWhole accepted a GPU in MIG mode")
	}
	if err := m.CheckShared(api.ResourceGPUMemory, []string{uuid(1) + "::mem::0"}); err == nil {
		t.Error("CheckShared accepted a unit of a GPU in MIG mode")
	}
}

func TestMIGUsage(t *testing.T) {
	m := mustModel(t, migGPUs(), migOpts())
	u, errs := m.UsageOf([]devices.Allocation{
		{Resource: mig1g, DeviceIDs: []string{migUUID(0, 2), migUUID(1, 6)}},
		{Resource: mig3g, DeviceIDs: []string{migUUID(1, 0)}},
		{Resource: mig2g, DeviceIDs: []string{migUUID(0, 1)}}, // wrong profile
		{Resource: api.ResourceGPU, DeviceIDs: []string{uuid(3)}},
	})
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), "not a 2g.10gb") {
		t.Errorf("UsageOf errors %v, want one for the wrong profile", errs)
	}
	want := devices.Usage{
		Whole:  map[string]bool{uuid(3): true},
		Shared: map[string]bool{},
		MIG:    map[string]bool{migUUID(0, 2): true, migUUID(1, 6): true, migUUID(1, 0): true},
	}
	if diff := cmp.Diff(want, u); diff != "" {
		t.Errorf("UsageOf (-want +got):\n%s", diff)
	}
}

func TestMIGModelErrors(t *testing.T) {
	tests := []struct {
		name   string
		mutate func([]devices.GPU)
		want   string
	}{
		{"bad UUID", func(g []devices.GPU) { g[0].MIG[0].UUID = "GPU-x" }, "not a MIG UUID"},
		{"duplicate", func(g []devices.GPU) { g[1].MIG[0].UUID = migUUID(0, 0) }, "listed twice"},
		{"instances without MIG mode", func(g []devices.GPU) {
			g[3].MIG = g[2].MIG[:0:0]
			g[3].MIG = append(g[3].MIG, devices.MIGInstance{UUID: migUUID(3, 0), Profile: "1g.5gb", Size: 1})
		}, "MIG mode is off"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g := migGPUs()
			tc.mutate(g)
			if _, err := devices.New(g, migOpts()); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("New = %v, want error containing %q", err, tc.want)
			}
		})
	}
	// An instance of a profile Tessera cannot serve is no device and no error.
	g := migGPUs()
	g[1].MIG[0].Profile = "1c.3g.20gb"
	m := mustModel(t, g, migOpts())
	if n := len(m.Devices(mig1g, nil, devices.Usage{})); n != 7 {
		t.Errorf("%d 1g.5gb devices with GPU 1's renamed, want 7", n)
	}
}
