package kubeletstate_test

// Fuzz targets for the parser of the kubelet device manager's checkpoint
// file. They check properties, not only "no panic"; `go test` runs the
// seeds.

import (
	"encoding/json"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/deviceplugin/kubeletstate"
)

// checkpointOf writes allocations as a checkpoint: DeviceIDs as a map of
// NUMA node to IDs (v2, the IDs split over two nodes) or as a list (v1).
func checkpointOf(t *testing.T, allocs []kubeletstate.ContainerDevices, v1 bool) []byte {
	t.Helper()
	type entry struct {
		PodUID, ContainerName, ResourceName string
		DeviceIDs                           any
	}
	var cp struct {
		Data struct{ PodDeviceEntries []entry }
	}
	for _, a := range allocs {
		var ids any = a.DeviceIDs
		if !v1 {
			half := len(a.DeviceIDs) / 2
			ids = map[string][]string{"0": a.DeviceIDs[:half], "-1": a.DeviceIDs[half:]}
		}
		cp.Data.PodDeviceEntries = append(cp.Data.PodDeviceEntries, entry{a.PodUID, a.Container, string(a.Resource), ids})
	}
	b, err := json.Marshal(cp)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// tesseraEntries counts the entries of a checkpoint that name a Tessera
// resource and at least one device, decoding it independently of
// ParseCheckpoint; ok is false when it is not such JSON.
func tesseraEntries(b []byte) (n int, ok bool) {
	var cp struct {
		Data struct {
			PodDeviceEntries []struct {
				ResourceName string
				DeviceIDs    any
			}
		}
	}
	if json.Unmarshal(b, &cp) != nil {
		return 0, false
	}
	for _, e := range cp.Data.PodDeviceEntries {
		if !api.IsTesseraResource(corev1.ResourceName(e.ResourceName)) {
			continue
		}
		switch ids := e.DeviceIDs.(type) {
		case []any:
			if len(ids) > 0 {
				n++
			}
		case map[string]any:
			for _, list := range ids {
				if l, _ := list.([]any); len(l) > 0 {
					n++
					break
				}
			}
		}
	}
	return n, true
}

// FuzzParseCheckpoint checks that ParseCheckpoint either fails with an
// error naming the checkpoint and returns nothing, or returns one
// allocation per entry of a Tessera resource with devices (none lost, none
// invented), in order, each with its device IDs sorted and without
// duplicates whichever form (v1 list, v2 map) the kubelet wrote; written
// back in either form, they parse to the same allocations.
func FuzzParseCheckpoint(f *testing.F) {
	for _, s := range []string{
		checkpointV2,
		checkpointV1,
		checkpointV2[:40],
		`{"Data":{"PodDeviceEntries":[{"PodUID":"u","ContainerName":"c","ResourceName":"tessera.dev/gpu","DeviceIDs":7}]}}`,
		`{"Data":{"PodDeviceEntries":[{"PodUID":"u","ContainerName":"c","ResourceName":"tessera.dev/gpu","DeviceIDs":null}]}}`,
		`{"Data":{"PodDeviceEntries":[{"PodUID":"u","ContainerName":"c","ResourceName":"tessera.dev/gpu","DeviceIDs":{"0":null,"1":[]}}]}}`,
		`{"Data":{"PodDeviceEntries":[{"PodUID":"u","ContainerName":"c","ResourceName":"tessera.dev/gpu-memory","DeviceIDs":{"0":["GPU-a::mem::1"],"1":["GPU-a::mem::1","GPU-a::mem::0"]}}]}}`,
		`{"Data":{"PodDeviceEntries":[{"PodUID":"u","ContainerName":"c","ResourceName":"tessera.dev/gpu","DeviceIDs":["GPU-b","GPU-a"]},{"PodUID":"u","ContainerName":"c","ResourceName":"tessera.dev/gpu","DeviceIDs":["GPU-c"]}]}}`,
		`{"Data":{"PodDeviceEntries":[{"poduid":"u","containername":"c","resourcename":"tessera.dev/mig-1g.5gb","deviceids":{"0":["MIG-a"]}}]}}`,
		`{"Data":{"PodDeviceEntries":null}}`,
		`{"Data":null}`,
		`{}`, `null`, `[]`, ``, `{"Data":{"PodDeviceEntries":[]}} x`,
	} {
		f.Add([]byte(s))
	}
	const source = "/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint"
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := kubeletstate.ParseCheckpoint(b, source)
		if err != nil {
			if got != nil {
				t.Fatalf("allocations %+v with error %v", got, err)
			}
			if !strings.Contains(err.Error(), "kubelet checkpoint "+source) {
				t.Fatalf("error %q does not name the checkpoint", err)
			}
			return
		}
		if n, ok := tesseraEntries(b); !ok || n != len(got) {
			t.Fatalf("%d allocations from %d entries of Tessera resources with devices (decodes: %v)", len(got), n, ok)
		}
		for i, a := range got {
			if !api.IsTesseraResource(a.Resource) || a.Namespace != "" || a.Name != "" || len(a.DeviceIDs) == 0 {
				t.Fatalf("allocation %d: %+v", i, a)
			}
			for k := 1; k < len(a.DeviceIDs); k++ {
				if a.DeviceIDs[k-1] >= a.DeviceIDs[k] {
					t.Fatalf("allocation %d: device IDs %q are not sorted without duplicates", i, a.DeviceIDs)
				}
			}
		}
		if !sort.SliceIsSorted(got, func(i, j int) bool {
			x, y := got[i], got[j]
			if x.PodUID != y.PodUID {
				return x.PodUID < y.PodUID
			}
			if x.Container != y.Container {
				return x.Container < y.Container
			}
			return x.Resource < y.Resource
		}) {
			t.Fatalf("allocations are not in order: %+v", got)
		}
		for _, v1 := range []bool{false, true} {
			enc := checkpointOf(t, got, v1)
			again, err := kubeletstate.ParseCheckpoint(enc, source)
			if err != nil {
				t.Fatalf("re-parsing %s: %v", enc, err)
			}
			if diff := cmp.Diff(got, again); diff != "" {
				t.Fatalf("re-parsed allocations differ (-parsed +re-parsed from %s):\n%s", enc, diff)
			}
		}
	})
}
