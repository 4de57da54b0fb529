package deviceplugin_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/deviceplugin"
	"github.com/tessera-gpu/tessera/deviceplugin/kubeletstate"
	"github.com/tessera-gpu/tessera/gpu"
	"github.com/tessera-gpu/tessera/gpu/nvmlmock"
)

type fakeAllocs struct {
	allocs []kubeletstate.ContainerDevices
	err    error
}

func (f *fakeAllocs) Allocations(context.Context) ([]kubeletstate.ContainerDevices, error) {
	return f.allocs, f.err
}
func (f *fakeAllocs) Name() string { return "fake" }

func newRepartitioner(t *testing.T) (*nvmlmock.Machine, gpu.Interface, *fakeAllocs, *deviceplugin.MIGRepartitioner) {
	t.Helper()
	m := nvmlmock.Builtin(nvmlmock.DGXA100MIGName)
	g := gpu.NewNVML(m.NVML())
	if err := g.Init(); err != nil {
		t.Fatal(err)
	}
	uuids := map[string]int{}
	for i := 0; i < 8; i++ {
		uuids[m.UUID(i)] = i
	}
	k := &fakeAllocs{}
	return m, g, k, &deviceplugin.MIGRepartitioner{Driver: g, Kubelet: k, GPUs: uuids}
}

func request(gen int64, uuid string, ins ...api.MIGLayoutInstance) *api.MIGLayoutRequest {
	return &api.MIGLayoutRequest{APIVersion: api.Version, Kind: api.KindMIGLayoutRequest, Generation: gen,
		GPUs: []api.MIGLayoutGPU{{UUID: uuid, Instances: ins}}}
}

var want4g = api.MIGLayoutInstance{Profile: "4g.20gb", MIGPlacement: api.MIGPlacement{Start: 0, Size: 4}}

func profiles(t *testing.T, g gpu.Interface, i int) string {
	t.Helper()
	info, err := g.MIG(i)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, in := range info.Instances {
		out = append(out, in.Profile)
	}
	return strings.Join(out, ",")
}

func TestMIGRepartitionApplied(t *testing.T) {
	m, g, _, r := newRepartitioner(t)
	st, changed := r.Apply(context.Background(), request(1, m.UUID(2), want4g))
	if st.State != api.MIGLayoutApplied || !changed || st.Generation != 1 {
		t.Fatalf("status %+v changed %v", st, changed)
	}
	if got := profiles(t, g, 2); got != "4g.20gb" {
		t.Fatalf("GPU 2 has %s", got)
	}
	if got := profiles(t, g, 3); got != "3g.20gb,2g.10gb,1g.5gb" {
		t.Fatalf("GPU 3 changed: %s", got)
	}
	// Served again: nothing to change.
	st, changed = r.Apply(context.Background(), request(2, m.UUID(2), want4g))
	if st.State != api.MIGLayoutApplied || changed {
		t.Fatalf("second time: %+v %v", st, changed)
	}
}

func TestMIGRepartitionRefusedWithTenant(t *testing.T) {
	m, g, k, r := newRepartitioner(t)
	// An instance of GPU 2 allocated by the kubelet.
	k.allocs = []kubeletstate.ContainerDevices{{Namespace: "ns", Name: "p", Container: "c", Resource: api.MIGResource("1g.5gb"), DeviceIDs: []string{m.MIGUUIDs(2)[2]}}}
	st, changed := r.Apply(context.Background(), request(1, m.UUID(2), want4g))
	if st.State != api.MIGLayoutRefused || changed || !strings.Contains(st.Message, "ns/p") {
		t.Fatalf("status %+v changed %v", st, changed)
	}
	if got := profiles(t, g, 2); got != "3g.20gb,2g.10gb,1g.5gb" {
		t.Fatalf("a GPU with a tenant was repartitioned: %s", got)
	}
	// The tenant is on another GPU: GPU 2 is free.
	k.allocs[0].DeviceIDs = []string{m.MIGUUIDs(3)[0]}
	if st, _ := r.Apply(context.Background(), request(2, m.UUID(2), want4g)); st.State != api.MIGLayoutApplied {
		t.Fatalf("free GPU: %+v", st)
	}
	// A process on GPU 3.
	m.SetProcesses(3, []nvml.ProcessInfo{{Pid: 42, UsedGpuMemory: 1 << 20}})
	k.allocs = nil
	st, _ = r.Apply(context.Background(), request(3, m.UUID(3), want4g))
	if st.State != api.MIGLayoutRefused || !strings.Contains(st.Message, "PID 42") {
		t.Fatalf("process: %+v", st)
	}
	if got := profiles(t, g, 3); got != "3g.20gb,2g.10gb,1g.5gb" {
		t.Fatalf("a GPU with a process was repartitioned: %s", got)
	}
	// The kubelet's allocations cannot be read: fail closed.
	m.SetProcesses(3, nil)
	k.err = errors.New("socket gone")
	st, _ = r.Apply(context.Background(), request(4, m.UUID(3), want4g))
	if st.State != api.MIGLayoutRefused || !strings.Contains(st.Message, "socket gone") {
		t.Fatalf("unreadable allocations: %+v", st)
	}
	if got := profiles(t, g, 3); got != "3g.20gb,2g.10gb,1g.5gb" {
		t.Fatalf("repartitioned without knowing the tenants: %s", got)
	}
	// Not the node's GPU, or not in MIG mode.
	k.err = nil
	if st, _ := r.Apply(context.Background(), request(5, "GPU-00000000", want4g)); st.State != api.MIGLayoutRefused {
		t.Fatalf("unknown GPU: %+v", st)
	}
	if st, _ := r.Apply(context.Background(), request(6, m.UUID(4), want4g)); st.State != api.MIGLayoutRefused || !strings.Contains(st.Message, "not in MIG mode") {
		t.Fatalf("GPU not in MIG mode: %+v", st)
	}
}

func TestMIGRepartitionNVMLFailure(t *testing.T) {
	m, g, _, r := newRepartitioner(t)
	m.FailMIGCreates(2, 1)
	st, changed := r.Apply(context.Background(), request(1, m.UUID(2), want4g, api.MIGLayoutInstance{Profile: "3g.20gb", MIGPlacement: api.MIGPlacement{Start: 4, Size: 4}}))
	if st.State != api.MIGLayoutFailed || !changed || !strings.Contains(st.Message, "CreateGpuInstanceWithPlacement") {
		t.Fatalf("status %+v changed %v", st, changed)
	}
	// The layout read again is what the driver has: nothing half-made is
	// hidden, other GPUs keep theirs.
	if got := profiles(t, g, 2); got != "" {
		t.Fatalf("GPU 2 after the failure: %q", got)
	}
	if got := profiles(t, g, 3); got != "3g.20gb,2g.10gb,1g.5gb" {
		t.Fatalf("GPU 3 changed: %s", got)
	}
	// The request stands: served on the next try.
	st, _ = r.Apply(context.Background(), request(1, m.UUID(2), want4g, api.MIGLayoutInstance{Profile: "3g.20gb", MIGPlacement: api.MIGPlacement{Start: 4, Size: 4}}))
	if st.State != api.MIGLayoutApplied || profiles(t, g, 2) != "4g.20gb,3g.20gb" {
		t.Fatalf("retry: %+v %s", st, profiles(t, g, 2))
	}
}

// A container allocated a MIG instance the node does not have (its layout
// changed under the pod) cannot be mapped to a GPU: no GPU of the node is
// repartitioned while it holds it.
func TestMIGRepartitionRefusedWithUnknownInstance(t *testing.T) {
	m, g, k, r := newRepartitioner(t)
	k.allocs = []kubeletstate.ContainerDevices{
		{Namespace: "ns", Name: "big", Container: "c", Resource: api.MIGResource("7g.40gb"), DeviceIDs: []string{"MIG-99999999-0000-0000-0000-000000000000"}},
		// Other resources' devices are not MIG instances.
		{Namespace: "ns", Name: "whole", Container: "c", Resource: api.ResourceGPU, DeviceIDs: []string{m.UUID(5)}},
	}
	st, changed := r.Apply(context.Background(), request(1, m.UUID(2), want4g))
	if st.State != api.MIGLayoutRefused || changed || !strings.Contains(st.Message, "ns/big") || !strings.Contains(st.Message, "does not have") {
		t.Fatalf("status %+v changed %v", st, changed)
	}
	if got := profiles(t, g, 2); got != "3g.20gb,2g.10gb,1g.5gb" {
		t.Fatalf("repartitioned while an allocation cannot be mapped: %s", got)
	}
	k.allocs = k.allocs[1:]
	if st, _ := r.Apply(context.Background(), request(2, m.UUID(2), want4g)); st.State != api.MIGLayoutApplied {
		t.Fatalf("once the allocation is gone: %+v", st)
	}
}
