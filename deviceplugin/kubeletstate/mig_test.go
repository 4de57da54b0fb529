package kubeletstate_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/deviceplugin/kubeletstate"
)

const (
	migA = "MIG-aaaaaaaa-0000-0000-0000-000000000000"
	migB = "MIG-bbbbbbbb-0000-0000-0000-000000000000"
)

// MIG allocations (tessera.dev/mig-<profile>) are read from both sources;
// a name that only looks like one (a malformed profile) is not Tessera's.
func TestMIGAllocations(t *testing.T) {
	sock := servePodResources(t, &fakePodResources{pods: []*podresourcesapi.PodResources{
		{Name: "infer", Namespace: "ml", Containers: []*podresourcesapi.ContainerResources{
			{Name: "c", Devices: []*podresourcesapi.ContainerDevices{
				devs("tessera.dev/mig-1g.5gb", migB, migA),
				devs("tessera.dev/mig-3g.20gb", migA),
				devs("tessera.dev/mig-huge", migA),
			}},
		}},
	}})
	got, err := (&kubeletstate.PodResources{Socket: sock}).Allocations(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := []kubeletstate.ContainerDevices{
		{Namespace: "ml", Name: "infer", Container: "c", Resource: api.MIGResource("1g.5gb"), DeviceIDs: []string{migA, migB}},
		{Namespace: "ml", Name: "infer", Container: "c", Resource: api.MIGResource("3g.20gb"), DeviceIDs: []string{migA}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("PodResources allocations (-want +got):\n%s", diff)
	}

	path := filepath.Join(t.TempDir(), kubeletstate.CheckpointFile)
	data := `{"Data":{"PodDeviceEntries":[
 {"PodUID":"uid-1","ContainerName":"c","ResourceName":"tessera.dev/mig-1g.5gb","DeviceIDs":{"0":["` + migB + `"],"-1":["` + migA + `"]},"AllocResp":"CgA="},
 {"PodUID":"uid-1","ContainerName":"c","ResourceName":"tessera.dev/mig-huge","DeviceIDs":{"0":["` + migA + `"]},"AllocResp":"CgA="}
],"RegisteredDevices":{}},"Checksum":1}`
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err = (&kubeletstate.Checkpoint{Path: path}).Allocations(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want = []kubeletstate.ContainerDevices{
		{PodUID: "uid-1", Container: "c", Resource: api.MIGResource("1g.5gb"), DeviceIDs: []string{migA, migB}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("checkpoint allocations (-want +got):\n%s", diff)
	}
}
