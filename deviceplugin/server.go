package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/tessera-gpu/tessera/deviceplugin/devices"
)

// handler is what a plugin server asks the agent. The server speaks the
// protocol; the handler decides.
type handler interface {
	// devices returns the kind's devices and a channel closed when they
	// change.
	devices(k Kind) ([]devices.Device, <-chan struct{})
	// sent is told each list ListAndWatch stream (a number unique among
	// the plugin's streams) sent to the kubelet, after the Send returned.
	sent(k Kind, list []devices.Device, stream uint64)
	// streamEnded is told when a ListAndWatch stream ends: the kubelet
	// closed it (it stopped or restarts) or the server stopped.
	streamEnded(k Kind, stream uint64)
	// preferred answers one container's GetPreferredAllocation request.
	preferred(ctx context.Context, k Kind, available, mustInclude []string, size int) ([]string, error)
	// allocateRequest checks and records the containers of one Allocate
	// request together: all succeed or none does.
	allocateRequest(ctx context.Context, k Kind, containers [][]string) ([]*pluginapi.ContainerAllocateResponse, error)
}

// plugin serves the device plugin API for one kind on one socket.
type plugin struct {
	pluginapi.UnimplementedDevicePluginServer

	kind     Kind
	resource corev1.ResourceName
	socket   string
	h        handler
	logger   klog.Logger

	// streams numbers the plugin's ListAndWatch streams.
	streams atomic.Uint64

	mu   sync.Mutex
	srv  *grpc.Server
	done chan struct{} // closed when srv stops
}

var _ pluginapi.DevicePluginServer = (*plugin)(nil)

func newPlugin(logger klog.Logger, k Kind, socket string, h handler) *plugin {
	r := k.Resource()
	return &plugin{kind: k, resource: r, socket: socket, h: h, logger: logger.WithValues("resource", r)}
}

// start listens on the plugin's socket (replacing a stale one) and serves.
func (p *plugin) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.srv != nil {
		return fmt.Errorf("%s plugin already serving", p.resource)
	}
	if err := os.Remove(p.socket); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing stale socket: %w", err)
	}
	lis, err := net.Listen("unix", p.socket)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", p.socket, err)
	}
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, p)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(lis); err != nil {
			p.logger.Error(err, "Device plugin server ended", "socket", p.socket)
		}
	}()
	p.srv, p.done = srv, done
	p.logger.V(2).Info("Serving the device plugin API", "socket", p.socket)
	return nil
}

// stop ends the server and its streams and removes the socket.
func (p *plugin) stop() {
	p.mu.Lock()
	srv, done := p.srv, p.done
	p.srv, p.done = nil, nil
	p.mu.Unlock()
	if srv == nil {
		return
	}
	srv.Stop()
	<-done
	if err := os.Remove(p.socket); err != nil && !errors.Is(err, fs.ErrNotExist) {
		p.logger.Error(err, "Removing the plugin socket")
	}
}

// options are the plugin's DevicePluginOptions.
func (p *plugin) options() *pluginapi.DevicePluginOptions {
	_, ok := p.kind.(PreferredAllocator)
	return &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: ok}
}

// GetDevicePluginOptions implements the device plugin API.
func (p *plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return p.options(), nil
}

// ListAndWatch implements the device plugin API: the full list, then a new
// full list whenever a device's health changes.
func (p *plugin) ListAndWatch(_ *pluginapi.Empty, stream grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	ctx := stream.Context()
	id := p.streams.Add(1)
	defer p.h.streamEnded(p.kind, id)
	var last []devices.Device
	first := true
	for {
		list, changed := p.h.devices(p.kind)
		if first || !equalDevices(last, list) {
			if err := stream.Send(listResponse(list)); err != nil {
				return fmt.Errorf("sending %s devices: %w", p.resource, err)
			}
			// Only now may the inventory stop naming a GPU this list
			// offers again (state.inventoryView).
			p.h.sent(p.kind, list, id)
			healthy := 0
			for _, d := range list {
				if d.Healthy {
					healthy++
				}
			}
			p.logger.V(2).Info("Sent devices to the kubelet", "devices", len(list), "healthy", healthy)
			last, first = list, false
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		}
	}
}

func equalDevices(a, b []devices.Device) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// listResponse renders devices for the kubelet: ID, health, and the NUMA
// node of the device's GPU.
func listResponse(list []devices.Device) *pluginapi.ListAndWatchResponse {
	resp := &pluginapi.ListAndWatchResponse{Devices: make([]*pluginapi.Device, 0, len(list))}
	topo := map[int]*pluginapi.TopologyInfo{}
	for _, d := range list {
		health := pluginapi.Healthy
		if !d.Healthy {
			health = pluginapi.Unhealthy
		}
		dev := &pluginapi.Device{ID: d.ID, Health: health}
		if d.NUMANode >= 0 {
			t, ok := topo[d.NUMANode]
			if !ok {
				t = &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: int64(d.NUMANode)}}}
				topo[d.NUMANode] = t
			}
			dev.Topology = t
		}
		resp.Devices = append(resp.Devices, dev)
	}
	return resp
}

// GetPreferredAllocation implements the device plugin API.
func (p *plugin) GetPreferredAllocation(ctx context.Context, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	resp := &pluginapi.PreferredAllocationResponse{}
	for _, c := range req.GetContainerRequests() {
		ids, err := p.h.preferred(ctx, p.kind, c.GetAvailableDeviceIDs(), c.GetMustIncludeDeviceIDs(), int(c.GetAllocationSize()))
		if err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "%s: %v", p.resource, err)
		}
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: ids})
	}
	return resp, nil
}

// Allocate implements the device plugin API. All containers of a request
// succeed or the request fails.
func (p *plugin) Allocate(ctx context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	var containers [][]string
	for _, c := range req.GetContainerRequests() {
		containers = append(containers, c.GetDevicesIds())
	}
	if len(containers) == 0 {
		return nil, status.Errorf(codes.InvalidArgument, "%s: Allocate without container requests", p.resource)
	}
	resps, err := p.h.allocateRequest(ctx, p.kind, containers)
	if err != nil {
		return nil, status.Errorf(codes.FailedPrecondition, "%s: %v", p.resource, err)
	}
	return &pluginapi.AllocateResponse{ContainerResponses: resps}, nil
}

// PreStartContainer implements the device plugin API; the plugin does not
// ask for it (PreStartRequired is false).
func (p *plugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

// Dialer connects to a unix socket; tests inject their own.
type Dialer func(ctx context.Context, addr string) (net.Conn, error)

func unixDialer(ctx context.Context, addr string) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "unix", addr)
}

// register registers the plugin with the kubelet listening on kubeletSocket.
//
// A refused connection is tried again within tens of milliseconds, not
// after gRPC's default second: the agent registers when kubelet.sock
// appears, a moment before the kubelet accepts on it, and a restarted
// kubelet admits the pods bound to its node about a second later. A plugin
// not registered by then has those pods refused ("no healthy devices
// present", UnexpectedAdmissionError).
func (p *plugin) register(ctx context.Context, kubeletSocket string, dial Dialer) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := grpc.NewClient("passthrough:///"+kubeletSocket,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(dial),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 20 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: time.Second,
		}))
	if err != nil {
		return fmt.Errorf("connecting to the kubelet at %s: %w", kubeletSocket, err)
	}
	defer conn.Close()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     filepath.Base(p.socket),
		ResourceName: string(p.resource),
		Options:      p.options(),
	}, grpc.WaitForReady(true))
	if err != nil {
		return fmt.Errorf("registering %s with the kubelet at %s: %w", p.resource, kubeletSocket, err)
	}
	return nil
}
