package gpu_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tessera-gpu/tessera/gpu"
	"github.com/tessera-gpu/tessera/gpu/nvmlmock"
)

func openMIGMock(t *testing.T, name string) (*nvmlmock.Machine, gpu.Interface) {
	t.Helper()
	m := nvmlmock.Builtin(name)
	g := gpu.NewNVML(m.NVML())
	if err := g.Init(); err != nil {
		t.Fatal(err)
	}
	return m, g
}

func TestSetMIGLayout(t *testing.T) {
	m, g := openMIGMock(t, nvmlmock.DGXA100MIGName)
	before, err := g.MIG(2)
	if err != nil {
		t.Fatal(err)
	}
	want := []gpu.MIGSpec{{Profile: "4g.20gb", Start: 0, Size: 4}, {Profile: "2g.10gb", Start: 4, Size: 2}, {Profile: "1g.10gb", Start: 6, Size: 2}}
	if err := g.SetMIGLayout(2, want); err != nil {
		t.Fatal(err)
	}
	after, err := g.MIG(2)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]migSummary{{"4g.20gb", 0, 4}, {"2g.10gb", 4, 2}, {"1g.10gb", 6, 2}}, summarize(after)); diff != "" {
		t.Fatalf("layout after (-want +got):\n%s", diff)
	}
	for _, in := range after.Instances {
		if slices.ContainsFunc(before.Instances, func(b gpu.MIGInstance) bool { return b.UUID == in.UUID }) {
			t.Errorf("a created instance has an old UUID %s", in.UUID)
		}
	}
	if got := m.MIGUUIDs(2); len(got) != 3 {
		t.Errorf("mock lists %d instances, want 3", len(got))
	}
	// Other GPUs are untouched.
	if other, _ := g.MIG(3); len(other.Instances) != 3 || other.Instances[0].Profile != "3g.20gb" {
		t.Errorf("GPU 3 changed: %+v", other.Instances)
	}
	// Empty layout: every instance destroyed.
	if err := g.SetMIGLayout(2, nil); err != nil {
		t.Fatal(err)
	}
	if empty, _ := g.MIG(2); !empty.Enabled || len(empty.Instances) != 0 {
		t.Fatalf("after an empty layout: %+v", empty)
	}
}

func TestSetMIGLayoutRefusals(t *testing.T) {
	m, g := openMIGMock(t, nvmlmock.DGXA100MIGName)
	// A profile the GPU cannot create: nothing destroyed.
	if err := g.SetMIGLayout(2, []gpu.MIGSpec{{Profile: "5g.25gb", Start: 0, Size: 4}}); err == nil || !strings.Contains(err.Error(), "5g.25gb") {
		t.Fatalf("unknown profile: %v", err)
	}
	if info, _ := g.MIG(2); len(info.Instances) != 3 {
		t.Fatalf("a refused layout destroyed instances: %+v", info.Instances)
	}
	// Overlapping instances: the driver refuses the second.
	err := g.SetMIGLayout(2, []gpu.MIGSpec{{Profile: "4g.20gb", Start: 0, Size: 4}, {Profile: "2g.10gb", Start: 2, Size: 2}})
	if err == nil || !strings.Contains(err.Error(), "CreateGpuInstanceWithPlacement") {
		t.Fatalf("overlap: %v", err)
	}
	if info, _ := g.MIG(2); len(info.Instances) != 1 || info.Instances[0].Profile != "4g.20gb" {
		t.Fatalf("after a failed layout the GPU has what was done: %+v", info.Instances)
	}
	// A driver failure: an error naming the call; the GPU has what was made.
	m.FailMIGCreates(3, 1)
	err = g.SetMIGLayout(3, []gpu.MIGSpec{{Profile: "7g.40gb", Start: 0, Size: 8}})
	var nerr *gpu.Error
	if !errors.As(err, &nerr) || nerr.Op != "CreateGpuInstanceWithPlacement" || nerr.Index != 3 {
		t.Fatalf("driver failure: %v", err)
	}
	if info, _ := g.MIG(3); !info.Enabled || len(info.Instances) != 0 {
		t.Fatalf("after the failure: %+v", info.Instances)
	}
	if err := g.SetMIGLayout(3, []gpu.MIGSpec{{Profile: "7g.40gb", Start: 0, Size: 8}}); err != nil {
		t.Fatalf("after the failure passed: %v", err)
	}
	// A GPU not in MIG mode.
	if err := g.SetMIGLayout(4, nil); !errors.Is(err, gpu.ErrNotSupported) {
		t.Fatalf("GPU not in MIG mode: %v", err)
	}
	// A lost GPU.
	m.SetLost(2, true)
	if err := g.SetMIGLayout(2, nil); !errors.Is(err, gpu.ErrGPULost) {
		t.Fatalf("lost GPU: %v", err)
	}
}

func TestSetMIGLayoutH100(t *testing.T) {
	_, g := openMIGMock(t, nvmlmock.DGXH100MIGName)
	if err := g.SetMIGLayout(3, []gpu.MIGSpec{{Profile: "4g.40gb", Start: 0, Size: 4}, {Profile: "1g.20gb", Start: 4, Size: 2}, {Profile: "1g.10gb", Start: 6, Size: 1}}); err != nil {
		t.Fatal(err)
	}
	info, _ := g.MIG(3)
	if diff := cmp.Diff([]migSummary{{"4g.40gb", 0, 4}, {"1g.20gb", 4, 2}, {"1g.10gb", 6, 1}}, summarize(info)); diff != "" {
		t.Fatalf("(-want +got):\n%s", diff)
	}
}
