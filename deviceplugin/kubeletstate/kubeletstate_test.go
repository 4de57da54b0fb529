package kubeletstate_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/deviceplugin/kubeletstate"
)

type fakePodResources struct {
	podresourcesapi.UnimplementedPodResourcesListerServer
	pods []*podresourcesapi.PodResources
}

func (f *fakePodResources) List(context.Context, *podresourcesapi.ListPodResourcesRequest) (*podresourcesapi.ListPodResourcesResponse, error) {
	return &podresourcesapi.ListPodResourcesResponse{PodResources: f.pods}, nil
}

// servePodResources serves f on a unix socket in a temporary directory.
func servePodResources(t *testing.T, f *fakePodResources) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "kubelet.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	podresourcesapi.RegisterPodResourcesListerServer(srv, f)
	go srv.Serve(lis) //nolint:errcheck // ends with Stop
	t.Cleanup(srv.Stop)
	return sock
}

func devs(resource string, ids ...string) *podresourcesapi.ContainerDevices {
	return &podresourcesapi.ContainerDevices{ResourceName: resource, DeviceIds: ids}
}

func TestPodResources(t *testing.T) {
	sock := servePodResources(t, &fakePodResources{pods: []*podresourcesapi.PodResources{
		{Name: "train", Namespace: "ml", Containers: []*podresourcesapi.ContainerResources{
			{Name: "main", Devices: []*podresourcesapi.ContainerDevices{devs("tessera.dev/gpu", "GPU-b", "GPU-a"), devs("nvidia.com/gpu", "x")}},
			{Name: "sidecar"},
		}},
		{Name: "infer", Namespace: "default", Containers: []*podresourcesapi.ContainerResources{
			{Name: "c", Devices: []*podresourcesapi.ContainerDevices{devs("tessera.dev/gpu-memory", "GPU-c::mem::1", "GPU-c::mem::0"), devs("tessera.dev/gpu-core")}},
		}},
	}})
	got, err := (&kubeletstate.PodResources{Socket: sock}).Allocations(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := []kubeletstate.ContainerDevices{
		{Namespace: "default", Name: "infer", Container: "c", Resource: api.ResourceGPUMemory, DeviceIDs: []string{"GPU-c::mem::0", "GPU-c::mem::1"}},
		{Namespace: "ml", Name: "train", Container: "main", Resource: api.ResourceGPU, DeviceIDs: []string{"GPU-a", "GPU-b"}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("allocations (-want +got):\n%s", diff)
	}
}

func TestPodResourcesUnreachable(t *testing.T) {
	_, err := (&kubeletstate.PodResources{Socket: filepath.Join(t.TempDir(), "none.sock")}).Allocations(context.Background())
	if err == nil || !strings.Contains(err.Error(), "none.sock") {
		t.Errorf("Allocations on a missing socket = %v, want an error naming it", err)
	}
}

// A checkpoint as the kubelet 1.34 device manager writes it.
const checkpointV2 = `{"Data":{"PodDeviceEntries":[
 {"PodUID":"uid-2","ContainerName":"c","ResourceName":"tessera.dev/gpu","DeviceIDs":{"0":["GPU-a"],"1":["GPU-e"]},"AllocResp":"CgA="},
 {"PodUID":"uid-1","ContainerName":"c","ResourceName":"tessera.dev/gpu-core","DeviceIDs":{"-1":["GPU-a::core::1","GPU-a::core::0"]},"AllocResp":"CgA="},
 {"PodUID":"uid-1","ContainerName":"c","ResourceName":"example.com/nic","DeviceIDs":{"0":["nic0"]},"AllocResp":"CgA="}
],"RegisteredDevices":{"tessera.dev/gpu":["GPU-a","GPU-e"]}},"Checksum":12345}`

// A checkpoint of kubelets before 1.20: DeviceIDs is a list.
const checkpointV1 = `{"Data":{"PodDeviceEntries":[
 {"PodUID":"uid-9","ContainerName":"c","ResourceName":"tessera.dev/gpu","DeviceIDs":["GPU-z"],"AllocResp":"CgA="}
],"RegisteredDevices":{}},"Checksum":1}`

func TestCheckpoint(t *testing.T) {
	for _, tc := range []struct {
		name, data string
		want       []kubeletstate.ContainerDevices
		wantErr    string
	}{
		{name: "v2", data: checkpointV2, want: []kubeletstate.ContainerDevices{
			{PodUID: "uid-1", Container: "c", Resource: api.ResourceGPUCore, DeviceIDs: []string{"GPU-a::core::0", "GPU-a::core::1"}},
			{PodUID: "uid-2", Container: "c", Resource: api.ResourceGPU, DeviceIDs: []string{"GPU-a", "GPU-e"}},
		}},
		{name: "v1", data: checkpointV1, want: []kubeletstate.ContainerDevices{
			{PodUID: "uid-9", Container: "c", Resource: api.ResourceGPU, DeviceIDs: []string{"GPU-z"}},
		}},
		// Found by FuzzParseCheckpoint: a v1 list kept an ID twice where
		// the same IDs in a v2 map were listed once.
		{name: "v1 duplicates", data: `{"Data":{"PodDeviceEntries":[{"PodUID":"u","ContainerName":"c","ResourceName":"tessera.dev/gpu","DeviceIDs":["GPU-b","GPU-a","GPU-b"]}]}}`, want: []kubeletstate.ContainerDevices{
			{PodUID: "u", Container: "c", Resource: api.ResourceGPU, DeviceIDs: []string{"GPU-a", "GPU-b"}},
		}},
		{name: "v2 duplicates", data: `{"Data":{"PodDeviceEntries":[{"PodUID":"u","ContainerName":"c","ResourceName":"tessera.dev/gpu","DeviceIDs":{"0":["GPU-b","GPU-a"],"1":["GPU-b"]}}]}}`, want: []kubeletstate.ContainerDevices{
			{PodUID: "u", Container: "c", Resource: api.ResourceGPU, DeviceIDs: []string{"GPU-a", "GPU-b"}},
		}},
		{name: "truncated", data: checkpointV2[:40], wantErr: "kubelet checkpoint"},
		{name: "bad device IDs", data: `{"Data":{"PodDeviceEntries":[{"PodUID":"u","ContainerName":"c","ResourceName":"tessera.dev/gpu","DeviceIDs":7}]}}`, wantErr: "PodDeviceEntries[0].DeviceIDs"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), kubeletstate.CheckpointFile)
			if err := os.WriteFile(path, []byte(tc.data), 0o600); err != nil {
				t.Fatal(err)
			}
			got, err := (&kubeletstate.Checkpoint{Path: path}).Allocations(context.Background())
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("allocations (-want +got):\n%s", diff)
			}
		})
	}
	got, err := (&kubeletstate.Checkpoint{Path: filepath.Join(t.TempDir(), "absent")}).Allocations(context.Background())
	if err != nil || len(got) != 0 {
		t.Errorf("missing checkpoint = %v, %v; want nothing", got, err)
	}
}

func TestFirst(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, kubeletstate.CheckpointFile)
	if err := os.WriteFile(path, []byte(checkpointV1), 0o600); err != nil {
		t.Fatal(err)
	}
	cp := &kubeletstate.Checkpoint{Path: path}
	src := kubeletstate.First{&kubeletstate.PodResources{Socket: filepath.Join(dir, "absent.sock")}, cp}
	got, from, err := src.AllocationsFrom(context.Background())
	if err != nil || from != cp || len(got) != 1 {
		t.Fatalf("AllocationsFrom = %v, %v, %v; want the checkpoint's one allocation", got, from, err)
	}
	bad := filepath.Join(dir, "bad")
	if err := os.WriteFile(bad, []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := (kubeletstate.First{&kubeletstate.Checkpoint{Path: bad}}).Allocations(context.Background()); err == nil || !strings.Contains(err.Error(), "no source") {
		t.Errorf("all sources failing = %v", err)
	}
}
