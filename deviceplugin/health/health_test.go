package health_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/deviceplugin/devices"
	"github.com/tessera-gpu/tessera/deviceplugin/health"
	"github.com/tessera-gpu/tessera/gpu"
	"github.com/tessera-gpu/tessera/gpu/nvmlmock"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func healthy() health.State { return health.State{Health: devices.Health{Healthy: true}} }

func TestApplyCheck(t *testing.T) {
	const delay = time.Minute
	xid := health.ApplyXID(healthy(), 79, t0)
	lostErr := fmt.Errorf("GetUUID on GPU 3: %w", gpu.ErrGPULost)
	for _, tc := range []struct {
		name string
		in   health.State
		err  error
		at   time.Time
		want health.State
	}{
		{"healthy stays healthy", healthy(), nil, t0, healthy()},
		{"lost", healthy(), lostErr, t0, health.State{Health: devices.Health{Reason: "GPU lost (fell off the bus)"}}},
		{"other error", healthy(), errors.New("boom"), t0, health.State{Health: devices.Health{Reason: "NVML health check failed: boom"}}},
		{"sound check before the recovery delay keeps the XID", xid, nil, t0.Add(delay - time.Second), xid},
		{"sound check after the recovery delay recovers", xid, nil, t0.Add(delay), healthy()},
		{"a failing check keeps the XID time", xid, lostErr, t0.Add(2 * delay), health.State{Health: devices.Health{Reason: "GPU lost (fell off the bus)"}, LastXID: t0}},
		{"lost GPU recovers when sound", health.State{Health: devices.Health{Reason: "GPU lost (fell off the bus)"}}, nil, t0, healthy()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := health.ApplyCheck(tc.in, tc.err, tc.at, delay)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("ApplyCheck (-want +got):\n%s", diff)
			}
		})
	}
	if got := health.ApplyXID(healthy(), 48, t0); got.Healthy || got.Reason != "XID 48" || !got.LastXID.Equal(t0) {
		t.Errorf("ApplyXID = %+v", got)
	}
}

// fakeClock is a settable clock.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func gpusOf(m *nvmlmock.Machine) []health.GPU {
	var out []health.GPU
	for i := range m.Profile().GPUs {
		out = append(out, health.GPU{Index: i, UUID: m.UUID(i)})
	}
	return out
}

// unhealthy lists the GPU indices that are unhealthy, with reasons.
func unhealthy(m *nvmlmock.Machine, h devices.HealthMap) map[int]string {
	out := map[int]string{}
	for i := range m.Profile().GPUs {
		if s := h.Of(m.UUID(i)); !s.Healthy {
			out[i] = s.Reason
		}
	}
	return out
}

func TestWatcherOnMockMachine(t *testing.T) {
	m := nvmlmock.DGXA100()
	lib := gpu.NewNVML(m.NVML())
	if err := lib.Init(); err != nil {
		t.Fatal(err)
	}
	clock := &fakeClock{now: t0}
	var mu sync.Mutex
	var xids []string
	w := health.New(lib, gpusOf(m), health.Options{
		IgnoredXIDs:   api.DefaultIgnoredXIDs(),
		CheckInterval: 10 * time.Millisecond,
		RecoveryDelay: time.Minute,
		Now:           clock.Now,
		OnXID: func(ev gpu.XIDEvent, ignored bool) {
			mu.Lock()
			defer mu.Unlock()
			xids = append(xids, fmt.Sprintf("%d:%d:%v", ev.Index, ev.XID, ignored))
		},
	})
	changes := make(chan devices.HealthMap, 100)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx, func(h devices.HealthMap) { changes <- h }) }()
	defer func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("Run returned %v, want context.Canceled", err)
		}
	}()

	// waitFor waits until the watcher reports the wanted unhealthy set.
	waitFor := func(what string, want map[int]string) {
		t.Helper()
		deadline := time.After(10 * time.Second)
		for {
			if diff := cmp.Diff(want, unhealthy(m, w.Health())); diff == "" {
				return
			}
			select {
			case <-changes:
			case <-time.After(5 * time.Millisecond):
			case <-deadline:
				t.Fatalf("%s: unhealthy GPUs (-want +got):\n%s", what, cmp.Diff(want, unhealthy(m, w.Health())))
			}
		}
	}
	// injectXID retries until the watcher's event set is registered.
	injectXID := func(i int, xid uint64) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for m.InjectXID(i, xid) == 0 {
			if time.Now().After(deadline) {
				t.Fatal("no event set registered for XIDs")
			}
			time.Sleep(5 * time.Millisecond)
		}
	}

	waitFor("start", map[int]string{})
	injectXID(2, 13) // application error: ignored
	injectXID(5, 79) // fell off the bus: critical
	waitFor("after XID 79 on GPU 5", map[int]string{5: "XID 79"})
	// Health checks keep passing, but the recovery delay holds GPU 5 down.
	time.Sleep(50 * time.Millisecond)
	waitFor("before the recovery delay", map[int]string{5: "XID 79"})

	m.SetLost(1, true)
	waitFor("GPU 1 lost", map[int]string{1: "GPU lost (fell off the bus)", 5: "XID 79"})
	clock.Add(time.Minute)
	waitFor("after the recovery delay", map[int]string{1: "GPU lost (fell off the bus)"})
	m.SetLost(1, false)
	waitFor("GPU 1 back", map[int]string{})

	mu.Lock()
	defer mu.Unlock()
	if diff := cmp.Diff([]string{"2:13:true", "5:79:false"}, xids); diff != "" {
		t.Errorf("XIDs seen (-want +got):\n%s", diff)
	}
}

// scriptedChecker fails its XID watch a number of times, then delivers
// events from a channel.
type scriptedChecker struct {
	mu       sync.Mutex
	failures int
	calls    int
	events   chan gpu.XIDEvent
}

func (c *scriptedChecker) CheckHealth(int) error { return nil }
func (c *scriptedChecker) WatchXIDs(ctx context.Context, out chan<- gpu.XIDEvent) error {
	c.mu.Lock()
	c.calls++
	fail := c.calls <= c.failures
	c.mu.Unlock()
	if fail {
		return errors.New("event set broken")
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case ev := <-c.events:
			out <- ev
		}
	}
}

func TestWatcherRetriesXIDWatchAndHandlesXIDWithoutGPU(t *testing.T) {
	c := &scriptedChecker{failures: 2, events: make(chan gpu.XIDEvent)}
	gpus := []health.GPU{{Index: 0, UUID: "GPU-a"}, {Index: 1, UUID: "GPU-b"}}
	w := health.New(c, gpus, health.Options{CheckInterval: 5 * time.Millisecond, RecoveryDelay: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go w.Run(ctx, nil) //nolint:errcheck // ends with ctx
	select {
	case c.events <- gpu.XIDEvent{Index: -1, XID: 62}:
	case <-time.After(10 * time.Second):
		t.Fatal("the XID watch was not restarted after failing")
	}
	deadline := time.Now().Add(10 * time.Second)
	want := devices.HealthMap{"GPU-a": {Reason: "XID 62"}, "GPU-b": {Reason: "XID 62"}}
	for !cmp.Equal(want, w.Health()) {
		if time.Now().After(deadline) {
			t.Fatalf("health (-want +got):\n%s", cmp.Diff(want, w.Health()))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestHandleXIDByIndexOnly(t *testing.T) {
	w := health.New(&scriptedChecker{}, []health.GPU{{Index: 0, UUID: "GPU-a"}, {Index: 1, UUID: "GPU-b"}}, health.Options{IgnoredXIDs: []uint64{43}})
	ctx := context.Background()
	if w.HandleXID(ctx, gpu.XIDEvent{Index: 1, XID: 43}) {
		t.Error("ignored XID changed health")
	}
	if !w.HandleXID(ctx, gpu.XIDEvent{Index: 1, XID: 48}) {
		t.Error("critical XID by index did not change health")
	}
	if w.HandleXID(ctx, gpu.XIDEvent{Index: 7, UUID: "GPU-z", XID: 48}) {
		t.Error("XID of an unwatched GPU changed health")
	}
	want := devices.HealthMap{"GPU-a": {Healthy: true}, "GPU-b": {Reason: "XID 48"}}
	if diff := cmp.Diff(want, w.Health()); diff != "" {
		t.Errorf("health (-want +got):\n%s", diff)
	}
}
