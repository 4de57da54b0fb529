package deviceplugin

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/deviceplugin/devices"
)

func TestWholeResponse(t *testing.T) {
	const u0, u3 = "GPU-aaaa", "GPU-dddd"
	gpus := []devices.GPU{{Index: 0, UUID: u0}, {Index: 3, UUID: u3}}
	cfg := func(strategies []string, mutate ...func(*api.NodeAgentConfig)) *api.NodeAgentConfig {
		c := api.NewNodeAgentConfig()
		c.DeviceListStrategy = strategies
		for _, m := range mutate {
			m(c)
		}
		if err := c.Validate(); err != nil {
			t.Fatal(err)
		}
		return c
	}
	void := map[string]string{"NVIDIA_VISIBLE_DEVICES": "void"}
	for _, tc := range []struct {
		name string
		cfg  *api.NodeAgentConfig
		want *pluginapi.ContainerAllocateResponse
	}{
		{
			name: "cdi-cri (default)",
			cfg:  api.NewNodeAgentConfig(),
			want: &pluginapi.ContainerAllocateResponse{Envs: void, CdiDevices: []*pluginapi.CDIDevice{{Name: "nvidia.com/gpu=" + u0}, {Name: "nvidia.com/gpu=" + u3}}},
		},
		{
			name: "cdi-annotations by index",
			cfg:  cfg([]string{api.DeviceListCDIAnnotations}, func(c *api.NodeAgentConfig) { c.CDIDeviceName = api.CDINameIndex }),
			want: &pluginapi.ContainerAllocateResponse{Envs: void, Annotations: map[string]string{"cdi.k8s.io/tessera-node_gpu": "nvidia.com/gpu=0,nvidia.com/gpu=3"}},
		},
		{
			name: "envvar",
			cfg:  cfg([]string{api.DeviceListEnvvar}),
			want: &pluginapi.ContainerAllocateResponse{Envs: map[string]string{"NVIDIA_VISIBLE_DEVICES": u0 + "," + u3}},
		},
		{
			name: "volume-mounts",
			cfg:  cfg([]string{api.DeviceListVolumeMounts}),
			want: &pluginapi.ContainerAllocateResponse{
				Envs: map[string]string{"NVIDIA_VISIBLE_DEVICES": "/var/run/nvidia-container-devices"},
				Mounts: []*pluginapi.Mount{
					{HostPath: "/dev/null", ContainerPath: "/var/run/nvidia-container-devices/" + u0, ReadOnly: true},
					{HostPath: "/dev/null", ContainerPath: "/var/run/nvidia-container-devices/" + u3, ReadOnly: true},
				},
			},
		},
		{
			name: "cdi-cri and envvar fallback, custom kind",
			cfg:  cfg([]string{api.DeviceListCDICRI, api.DeviceListEnvvar}, func(c *api.NodeAgentConfig) { c.CDIKind = "example.com/gpu" }),
			want: &pluginapi.ContainerAllocateResponse{
				Envs:       map[string]string{"NVIDIA_VISIBLE_DEVICES": u0 + "," + u3},
				CdiDevices: []*pluginapi.CDIDevice{{Name: "example.com/gpu=" + u0}, {Name: "example.com/gpu=" + u3}},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, wholeResponse(tc.cfg, gpus), protocmp.Transform()); diff != "" {
				t.Errorf("response (-want +got):\n%s", diff)
			}
		})
	}
}

func TestSharedResponseGivesNoGPU(t *testing.T) {
	want := &pluginapi.ContainerAllocateResponse{Envs: map[string]string{"NVIDIA_VISIBLE_DEVICES": "void"}}
	if diff := cmp.Diff(want, sharedResponse(), protocmp.Transform()); diff != "" {
		t.Errorf("shared response (-want +got):\n%s", diff)
	}
}

func TestListResponseTopology(t *testing.T) {
	got := listResponse([]devices.Device{
		{ID: "a", NUMANode: 1, Healthy: true},
		{ID: "b", NUMANode: -1, Healthy: false, Reason: "XID 79"},
	})
	want := &pluginapi.ListAndWatchResponse{Devices: []*pluginapi.Device{
		{ID: "a", Health: pluginapi.Healthy, Topology: &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: 1}}}},
		{ID: "b", Health: pluginapi.Unhealthy},
	}}
	if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
		t.Errorf("list (-want +got):\n%s", diff)
	}
}
