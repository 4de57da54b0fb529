package deviceplugin

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/tessera-gpu/tessera/api"
)

type registrations struct {
	pluginapi.UnimplementedRegistrationServer
	got chan *pluginapi.RegisterRequest
}

func (r *registrations) Register(_ context.Context, req *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	r.got <- req
	return &pluginapi.Empty{}, nil
}

// TestRegisterRetriesARefusedConnectionSoon: kubelet.sock exists a moment
// before the kubelet accepts on it. A refused connection is tried again
// within tens of milliseconds (gRPC's default backoff waits 0.8-1.2 s, by
// when a restarted kubelet may have refused the pods bound to its node).
func TestRegisterRetriesARefusedConnectionSoon(t *testing.T) {
	dir, err := os.MkdirTemp("", "reg") // unix socket paths are short
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, KubeletSocketName)
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	regs := &registrations{got: make(chan *pluginapi.RegisterRequest, 1)}
	pluginapi.RegisterRegistrationServer(srv, regs)
	go srv.Serve(lis) //nolint:errcheck // ends with Stop
	t.Cleanup(srv.Stop)

	const refusals = 3
	var mu sync.Mutex
	var attempts []time.Time
	dial := func(ctx context.Context, addr string) (net.Conn, error) {
		mu.Lock()
		attempts = append(attempts, time.Now())
		n := len(attempts)
		mu.Unlock()
		if n <= refusals {
			return nil, &net.OpError{Op: "dial", Net: "unix", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
		}
		return unixDialer(ctx, addr)
	}
	p := newPlugin(klog.Background(), &gpuKind{}, filepath.Join(dir, SocketName(api.ResourceGPU)), nil)
	if err := p.register(t.Context(), sock, dial); err != nil {
		t.Fatal(err)
	}
	if req := <-regs.got; req.ResourceName != string(api.ResourceGPU) || req.Endpoint != SocketName(api.ResourceGPU) {
		t.Errorf("registered %q at %q", req.ResourceName, req.Endpoint)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(attempts) != refusals+1 {
		t.Fatalf("%d connection attempts, want %d", len(attempts), refusals+1)
	}
	for i := 1; i < len(attempts); i++ {
		// Far above the 20-50 ms asked for, far below the default's 800 ms.
		if gap := attempts[i].Sub(attempts[i-1]); gap > 400*time.Millisecond {
			t.Errorf("attempt %d came %s after a refused one", i+1, gap)
		}
	}
}
