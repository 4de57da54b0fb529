package kubelet_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/tessera-gpu/tessera/test/framework/kubelet"
)

// testPlugin is a minimal device plugin speaking the v1beta1 gRPC API over a
// unix socket in the device-plugin directory. Like a real plugin, it
// registers with kubelet.sock and registers again (with a fresh socket)
// whenever kubelet.sock is re-created, i.e. after a kubelet restart.
type testPlugin struct {
	pluginapi.UnimplementedDevicePluginServer

	resource string
	endpoint string // socket file name in the device-plugin dir

	mu            sync.Mutex
	devices       []*pluginapi.Device
	watchers      map[chan struct{}]struct{}
	allocs        [][]string // device IDs of every Allocate call
	registrations int
	paused        bool // do not re-register while set
	server        *grpc.Server
	kubeletSock   sockID // the kubelet.sock we registered with
	lastErr       error

	stop chan struct{}
	done chan struct{}
}

// sockID tells one kubelet.sock from the next (a tmpfs may reuse inodes).
type sockID struct {
	ino     uint64
	ctimeNs int64
}

// newTestPlugin advertises the given devices as resource.
func newTestPlugin(resource, endpoint string, devices []*pluginapi.Device) *testPlugin {
	return &testPlugin{
		resource: resource,
		endpoint: endpoint,
		devices:  devices,
		watchers: map[chan struct{}]struct{}{},
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
}

// numaDevices makes n devices named <prefix>-<i>; device i sits on NUMA
// node numa[i].
func numaDevices(prefix string, numa ...int64) []*pluginapi.Device {
	out := make([]*pluginapi.Device, 0, len(numa))
	for i, n := range numa {
		out = append(out, &pluginapi.Device{
			ID:       fmt.Sprintf("%s-%d", prefix, i),
			Health:   pluginapi.Healthy,
			Topology: &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: n}}},
		})
	}
	return out
}

// startTestPlugin runs p until the test ends: it (re)registers whenever a
// new kubelet.sock shows up.
func startTestPlugin(t *testing.T, p *testPlugin) *testPlugin {
	t.Helper()
	go p.run()
	t.Cleanup(func() {
		close(p.stop)
		<-p.done
	})
	return p
}

func (p *testPlugin) run() {
	defer close(p.done)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-p.stop:
			p.mu.Lock()
			if p.server != nil {
				p.server.Stop()
			}
			p.mu.Unlock()
			return
		case <-tick.C:
		}
		var st syscall.Stat_t
		if err := syscall.Stat(kubelet.KubeletSocket, &st); err != nil {
			continue // kubelet not (yet) there
		}
		id := sockID{ino: st.Ino, ctimeNs: st.Ctim.Nano()}
		p.mu.Lock()
		due := id != p.kubeletSock && !p.paused
		p.mu.Unlock()
		if !due {
			continue
		}
		err := p.serveAndRegister()
		p.mu.Lock()
		p.lastErr = err
		if err == nil {
			p.kubeletSock = id
			p.registrations++
		}
		p.mu.Unlock()
	}
}

// serveAndRegister (re)starts the plugin's gRPC server on a fresh socket
// (a starting kubelet deletes all sockets in the directory) and calls
// Register on kubelet.sock.
func (p *testPlugin) serveAndRegister() error {
	sock := filepath.Join(kubelet.DevicePluginDir, p.endpoint)
	p.mu.Lock()
	if p.server != nil {
		p.server.Stop()
		p.server = nil
	}
	p.mu.Unlock()
	if err := os.Remove(sock); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("remove old plugin socket: %w", err)
	}
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", sock, err)
	}
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, p)
	go func() { _ = srv.Serve(ln) }()
	p.mu.Lock()
	p.server = srv
	p.mu.Unlock()

	conn, err := grpc.NewClient("unix://"+kubelet.KubeletSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("dial kubelet: %w", err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     p.endpoint,
		ResourceName: p.resource,
		Options:      &pluginapi.DevicePluginOptions{},
	})
	if err != nil {
		return fmt.Errorf("register %s: %w", p.resource, err)
	}
	return nil
}

func (p *testPlugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

func (p *testPlugin) ListAndWatch(_ *pluginapi.Empty, stream pluginapi.DevicePlugin_ListAndWatchServer) error {
	changed := make(chan struct{}, 1)
	p.mu.Lock()
	p.watchers[changed] = struct{}{}
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.watchers, changed)
		p.mu.Unlock()
	}()
	for {
		if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: p.snapshot()}); err != nil {
			return err
		}
		select {
		case <-changed:
		case <-stream.Context().Done():
			return nil
		case <-p.stop:
			return nil
		}
	}
}

func (p *testPlugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for _, cr := range req.ContainerRequests {
		ids := slices.Clone(cr.DevicesIds)
		slices.Sort(ids)
		p.mu.Lock()
		p.allocs = append(p.allocs, ids)
		p.mu.Unlock()
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{
			Envs:        map[string]string{"TEST_DEVICES": strings.Join(ids, ",")},
			Annotations: map[string]string{"test.tessera.io/devices": strings.Join(ids, ",")},
		})
	}
	return resp, nil
}

// setHealth changes one device's health and tells every ListAndWatch stream.
func (p *testPlugin) setHealth(id, health string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, d := range p.devices {
		if d.ID == id {
			d.Health = health
		}
	}
	for w := range p.watchers {
		select {
		case w <- struct{}{}:
		default:
		}
	}
}

func (p *testPlugin) snapshot() []*pluginapi.Device {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]*pluginapi.Device, 0, len(p.devices))
	for _, d := range p.devices {
		out = append(out, &pluginapi.Device{ID: d.ID, Health: d.Health, Topology: d.Topology})
	}
	return out
}

// allocations returns the device IDs of every Allocate call so far.
func (p *testPlugin) allocations() [][]string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.allocs)
}

func (p *testPlugin) registered() (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.registrations, p.lastErr
}

// setPaused stops (or resumes) re-registration.
func (p *testPlugin) setPaused(paused bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.paused = paused
}

// waitRegistered waits until the plugin has registered n times in total.
func (p *testPlugin) waitRegistered(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := p.registered()
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("plugin %s registered %d times within 10s, want %d (last error: %v)", p.resource, got, n, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
