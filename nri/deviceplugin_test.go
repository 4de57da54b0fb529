package nri

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/klog/v2/ktesting"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/deviceplugin"
	"github.com/tessera-gpu/tessera/deviceplugin/devices"
	"github.com/tessera-gpu/tessera/gpu"
	"github.com/tessera-gpu/tessera/gpu/nvmlmock"
	"github.com/tessera-gpu/tessera/topology"
)

// registrar is the kubelet's registration service, enough for the device
// plugin to serve: it records the endpoints that registered.
type registrar struct {
	pluginapi.UnimplementedRegistrationServer
	mu        sync.Mutex
	endpoints map[string]bool
}

func (r *registrar) Register(_ context.Context, req *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.endpoints[req.Endpoint] = true
	return &pluginapi.Empty{}, nil
}

func (r *registrar) registered(endpoint string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.endpoints[endpoint]
}

// The device plugin's shared Allocate is refused until the NRI plugin is
// connected to the runtime, and succeeds once it is: the real Plugin is the
// device plugin's NRI, and the runtime side is NRI's own adaptation.
func TestDevicePluginSharedAllocateFollowsNRIConnection(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	m := nvmlmock.DGXA100()
	sys := t.TempDir()
	if err := m.WriteSysfs(sys); err != nil {
		t.Fatal(err)
	}
	lib := gpu.NewNVML(m.NVML())
	if err := lib.Init(); err != nil {
		t.Fatal(err)
	}
	topo, err := topology.Build(lib, topology.Sysfs{Root: sys})
	if err != nil {
		t.Fatal(err)
	}

	// The NRI plugin; the harness's runtime is started later.
	h := newHarness(t)

	pluginDir, err := os.MkdirTemp("", "dp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(pluginDir) })
	reg := &registrar{endpoints: map[string]bool{}}
	lis, err := net.Listen("unix", filepath.Join(pluginDir, deviceplugin.KubeletSocketName))
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	pluginapi.RegisterRegistrationServer(srv, reg)
	go srv.Serve(lis) //nolint:errcheck // ends with Stop
	t.Cleanup(srv.Stop)

	cfg := api.NewNodeAgentConfig()
	cfg.MemoryReserveMiB = 1024
	agent, err := deviceplugin.New(deviceplugin.Options{
		Config: cfg, NodeName: "n1", PluginDir: pluginDir, Topology: topo, GPU: lib,
		Kubelet: staticSource{},
		NRI:     h.plugin,
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- agent.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})

	endpoint := deviceplugin.SocketName(api.ResourceGPUMemory)
	deadline := time.Now().Add(20 * time.Second)
	for !reg.registered(endpoint) {
		if time.Now().After(deadline) {
			t.Fatal("the device plugin did not register in time")
		}
		time.Sleep(10 * time.Millisecond)
	}
	conn, err := grpc.NewClient("unix://"+filepath.Join(pluginDir, endpoint), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := pluginapi.NewDevicePluginClient(conn)
	units := []string{devices.DeviceID(api.ResourceGPUMemory, m.UUID(3), 0), devices.DeviceID(api.ResourceGPUMemory, m.UUID(3), 1)}
	allocate := func() (*pluginapi.AllocateResponse, error) {
		return client.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: units}}})
	}

	if _, err := allocate(); err == nil || !strings.Contains(err.Error(), "requires the Tessera NRI plugin") {
		t.Fatalf("shared Allocate without an NRI connection = %v, want a refusal", err)
	}

	rt := startRuntime(t, h.dir, nil, nil)
	t.Cleanup(rt.Stop)
	rt.waitPlugin(t)
	h.observer.want(t, true)
	resp, err := allocate()
	if err != nil {
		t.Fatalf("shared Allocate with NRI connected: %v", err)
	}
	if got := resp.GetContainerResponses()[0].GetEnvs()[api.EnvNVIDIAVisibleDevices]; got != "void" {
		t.Errorf("shared Allocate gives %s=%q, want void (NRI injects the GPU)", api.EnvNVIDIAVisibleDevices, got)
	}

	// The runtime goes away: shared units are refused again.
	rt.Stop()
	h.observer.want(t, false)
	if _, err := allocate(); err == nil || !strings.Contains(err.Error(), "requires the Tessera NRI plugin") {
		t.Fatalf("shared Allocate after the runtime went away = %v, want a refusal", err)
	}
}

// The plugin is what the device plugin agent asks whether NRI is connected.
var _ deviceplugin.NRI = (*Plugin)(nil)

// The ledger is what the agent asks which GPUs the runtime's containers use.
var _ deviceplugin.RuntimeUse = (*Ledger)(nil)
