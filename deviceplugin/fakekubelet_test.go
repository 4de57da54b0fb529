package deviceplugin_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// fakeKubelet is the kubelet's side of device plugin registration, speaking
// real gRPC on kubelet.sock in a directory: on Register it connects to the
// plugin's socket and follows its ListAndWatch stream, as the device manager
// does.
type fakeKubelet struct {
	pluginapi.UnimplementedRegistrationServer
	t   testing.TB
	dir string
	srv *grpc.Server

	mu      sync.Mutex
	changed chan struct{}
	clients map[corev1.ResourceName]*pluginConn
	regs    []string // resource names in registration order
}

type pluginConn struct {
	conn    *grpc.ClientConn
	client  pluginapi.DevicePluginClient
	opts    *pluginapi.DevicePluginOptions
	devices []*pluginapi.Device
	cancel  context.CancelFunc
}

func startFakeKubelet(t testing.TB, dir string) *fakeKubelet {
	t.Helper()
	k := &fakeKubelet{t: t, dir: dir, changed: make(chan struct{}), clients: map[corev1.ResourceName]*pluginConn{}}
	lis, err := net.Listen("unix", filepath.Join(dir, "kubelet.sock"))
	if err != nil {
		t.Fatal(err)
	}
	k.srv = grpc.NewServer()
	pluginapi.RegisterRegistrationServer(k.srv, k)
	go k.srv.Serve(lis) //nolint:errcheck // ends with stop
	t.Cleanup(k.stop)
	return k
}

// stop ends the kubelet: its socket goes and its plugin connections close.
func (k *fakeKubelet) stop() {
	k.srv.Stop()
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, c := range k.clients {
		c.cancel()
		c.conn.Close()
	}
	k.clients = map[corev1.ResourceName]*pluginConn{}
}

func (k *fakeKubelet) notify() {
	close(k.changed)
	k.changed = make(chan struct{})
}

func (k *fakeKubelet) Register(_ context.Context, req *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	if req.Version != pluginapi.Version {
		return nil, fmt.Errorf("version %q", req.Version)
	}
	if filepath.Base(req.Endpoint) != req.Endpoint {
		return nil, fmt.Errorf("endpoint %q is not a file name in the plugin directory", req.Endpoint)
	}
	conn, err := grpc.NewClient("passthrough:///"+filepath.Join(k.dir, req.Endpoint),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", addr)
		}))
	if err != nil {
		return nil, err
	}
	client := pluginapi.NewDevicePluginClient(conn)
	opts, err := client.GetDevicePluginOptions(context.Background(), &pluginapi.Empty{})
	if err != nil {
		conn.Close()
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := client.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		cancel()
		conn.Close()
		return nil, err
	}
	r := corev1.ResourceName(req.ResourceName)
	pc := &pluginConn{conn: conn, client: client, opts: opts, cancel: cancel}
	k.mu.Lock()
	if old := k.clients[r]; old != nil {
		old.cancel()
		old.conn.Close()
	}
	k.clients[r] = pc
	k.regs = append(k.regs, req.ResourceName)
	k.notify()
	k.mu.Unlock()
	go func() {
		for {
			resp, err := stream.Recv()
			if err != nil {
				return
			}
			k.mu.Lock()
			if k.clients[r] == pc {
				pc.devices = resp.Devices
				k.notify()
			}
			k.mu.Unlock()
		}
	}()
	return &pluginapi.Empty{}, nil
}

// waitFor waits until cond, called under the kubelet's lock, holds; cond
// also describes what it saw, for the failure message.
func (k *fakeKubelet) waitFor(what string, cond func() (bool, string)) {
	k.t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		k.mu.Lock()
		ok, saw := cond()
		ch := k.changed
		k.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-ch:
		case <-time.After(20 * time.Millisecond):
		case <-deadline:
			k.t.Fatalf("timed out waiting for %s; last saw %s", what, saw)
		}
	}
}

// counts returns the number of healthy and unhealthy devices of r.
func (k *fakeKubelet) countsLocked(r corev1.ResourceName) (healthy, unhealthy int) {
	c := k.clients[r]
	if c == nil {
		return -1, -1
	}
	for _, d := range c.devices {
		if d.Health == pluginapi.Healthy {
			healthy++
		} else {
			unhealthy++
		}
	}
	return healthy, unhealthy
}

// waitCounts waits until every resource in want has the given healthy
// device count (and all devices listed).
func (k *fakeKubelet) waitCounts(what string, total, want map[corev1.ResourceName]int) {
	k.t.Helper()
	k.waitFor(fmt.Sprintf("%s: healthy %v of %v", what, want, total), func() (bool, string) {
		ok, saw := true, ""
		for r, n := range want {
			h, u := k.countsLocked(r)
			saw += fmt.Sprintf(" %s=%d/%d", r, h, h+u)
			if h != n || h+u != total[r] {
				ok = false
			}
		}
		return ok, saw
	})
}

// device returns the last listed device with the given ID.
func (k *fakeKubelet) device(r corev1.ResourceName, id string) *pluginapi.Device {
	k.mu.Lock()
	defer k.mu.Unlock()
	if c := k.clients[r]; c != nil {
		for _, d := range c.devices {
			if d.ID == id {
				return d
			}
		}
	}
	return nil
}

// healthyIDs lists r's healthy devices.
func (k *fakeKubelet) healthyIDs(r corev1.ResourceName) []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []string
	if c := k.clients[r]; c != nil {
		for _, d := range c.devices {
			if d.Health == pluginapi.Healthy {
				out = append(out, d.ID)
			}
		}
	}
	return out
}

func (k *fakeKubelet) client(r corev1.ResourceName) pluginapi.DevicePluginClient {
	k.mu.Lock()
	defer k.mu.Unlock()
	c := k.clients[r]
	if c == nil {
		k.t.Fatalf("%s is not registered", r)
	}
	return c.client
}

func (k *fakeKubelet) allocate(r corev1.ResourceName, ids ...string) (*pluginapi.ContainerAllocateResponse, error) {
	resp, err := k.client(r).Allocate(context.Background(), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids}}})
	if err != nil {
		return nil, err
	}
	if len(resp.ContainerResponses) != 1 {
		return nil, errors.New("not one container response")
	}
	return resp.ContainerResponses[0], nil
}

func (k *fakeKubelet) preferred(r corev1.ResourceName, available, must []string, size int) ([]string, error) {
	resp, err := k.client(r).GetPreferredAllocation(context.Background(), &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{
		AvailableDeviceIDs: available, MustIncludeDeviceIDs: must, AllocationSize: int32(size),
	}}})
	if err != nil {
		return nil, err
	}
	return resp.ContainerResponses[0].DeviceIDs, nil
}

// shortTempDir is a temporary directory with a path short enough for unix
// sockets.
func shortTempDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "dp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}
