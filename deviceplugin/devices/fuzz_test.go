package devices_test

// Fuzz targets for the parser of the device IDs the kubelet hands back.
// Each checks properties, not only "no panic"; `go test` runs the seeds.

import (
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/deviceplugin/devices"
)

// FuzzParseDeviceID checks that ParseDeviceID either fails with an error
// naming the resource and returns nothing, or returns a GPU UUID that could
// be one (not empty, no "::", the separator of unit IDs) and a unit number
// (0 for a whole GPU, never negative) from which DeviceID rebuilds exactly
// the ID it was given.
func FuzzParseDeviceID(f *testing.F) {
	u := uuid(3)
	for _, s := range []struct {
		r  corev1.ResourceName
		id string
	}{
		{api.ResourceGPU, u},
		{api.ResourceGPUMemory, u + "::mem::17"},
		{api.ResourceGPUCore, u + "::core::99"},
		{api.ResourceGPUCore, u + "::core::0"},
		{api.ResourceGPU, u + "::mem::1"},
		{api.ResourceGPU, ""},
		{api.ResourceGPU, "::"},
		{api.ResourceGPUMemory, u + "::core::1"},
		{api.ResourceGPUMemory, u + "::mem::x"},
		{api.ResourceGPUMemory, u + "::mem::-1"},
		{api.ResourceGPUMemory, u + "::mem::01"},
		{api.ResourceGPUMemory, u + "::mem::+1"},
		{api.ResourceGPUMemory, u + "::mem::"},
		{api.ResourceGPUMemory, "::mem::1"},
		{api.ResourceGPUMemory, u + "::mem::1::mem::2"},
		{api.ResourceGPUMemory, u + "::core::1::mem::2"},
		{api.ResourceGPUCore, u + "::core::99999999999999999999"},
		{api.MIGResource("1g.5gb"), "MIG-00000000-0000-0000-0000-000000000000"},
		{"nvidia.com/gpu", u},
		{"", ""},
	} {
		f.Add(string(s.r), s.id)
	}
	f.Fuzz(func(t *testing.T, resource, id string) {
		r := corev1.ResourceName(resource)
		gotUUID, n, err := devices.ParseDeviceID(r, id)
		if err != nil {
			if gotUUID != "" || n != 0 {
				t.Fatalf("ParseDeviceID(%q, %q) = %q, %d with error %v; want nothing", r, id, gotUUID, n, err)
			}
			if msg := err.Error(); !strings.Contains(msg, resource) && !strings.Contains(msg, strconv.Quote(resource)) {
				t.Fatalf("error %q does not name the resource %q", msg, r)
			}
			return
		}
		if !api.IsTesseraResource(r) {
			t.Fatalf("ParseDeviceID accepted resource %q, not a Tessera one", r)
		}
		if gotUUID == "" || strings.Contains(gotUUID, "::") {
			t.Fatalf("ParseDeviceID(%q, %q): UUID %q cannot be a GPU's", r, id, gotUUID)
		}
		if n < 0 || (r == api.ResourceGPU && n != 0) {
			t.Fatalf("ParseDeviceID(%q, %q): unit %d", r, id, n)
		}
		if back := devices.DeviceID(r, gotUUID, n); back != id {
			t.Fatalf("ParseDeviceID(%q, %q) = %q, %d; DeviceID gives back %q", r, id, gotUUID, n, back)
		}
	})
}
