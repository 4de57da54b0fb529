package topology_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/google/go-cmp/cmp"

	"github.com/tessera-gpu/tessera/gpu"
	"github.com/tessera-gpu/tessera/gpu/nvmlmock"
	"github.com/tessera-gpu/tessera/topology"
)

// layout renders a GPU's MIG instances as "profile@start+size".
func layout(g topology.GPU) []string {
	if g.MIG == nil {
		return nil
	}
	out := []string{}
	for _, in := range g.MIG.Instances {
		out = append(out, in.Profile+"@"+itoa(in.Start)+"+"+itoa(in.Size))
	}
	return out
}

func TestMIGLayouts(t *testing.T) {
	seven := func(p string) []string {
		var out []string
		for s := 0; s < 7; s++ {
			out = append(out, p+"@"+itoa(s)+"+1")
		}
		return out
	}
	mixed := []string{"3g.20gb@0+4", "2g.10gb@4+2", "1g.5gb@6+1"}
	tests := []struct {
		machine string
		want    [][]string
	}{
		{nvmlmock.DGXA100MIGName, [][]string{seven("1g.5gb"), seven("1g.5gb"), mixed, mixed, nil, nil, nil, nil}},
		{nvmlmock.DGXH100MIGName, [][]string{seven("1g.10gb"), seven("1g.10gb"), {"3g.40gb@0+4", "3g.40gb@4+4"}, {"3g.40gb@0+4", "3g.40gb@4+4"}, nil, nil, nil, nil}},
		{nvmlmock.DGXA100Name, make([][]string, 8)},
		{nvmlmock.DGX1VName, make([][]string, 8)},
	}
	for _, tc := range tests {
		t.Run(tc.machine, func(t *testing.T) {
			m := nvmlmock.Builtin(tc.machine)
			topo := build(t, m)
			var got [][]string
			for i, g := range topo.GPUs {
				got = append(got, layout(g))
				if g.MIG == nil {
					continue
				}
				for k, in := range g.MIG.Instances {
					if in.UUID != m.MIGUUIDs(i)[k] || !strings.HasPrefix(in.UUID, "MIG-") || in.MemoryMiB == 0 {
						t.Errorf("GPU %d instance %d: %+v", i, k, in)
					}
				}
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("MIG layouts (-want +got):\n%s", diff)
			}
		})
	}
}

// A GPU lost while its MIG layout is read is listed as lost, not served
// without its instances.
func TestMIGLostGPU(t *testing.T) {
	m := nvmlmock.DGXA100MIG()
	src := &migFailing{Interface: openLib(t, m), index: 2, err: &gpu.Error{Op: "GetMigMode", Index: 2, Return: nvml.ERROR_GPU_IS_LOST}}
	root := t.TempDir()
	if err := m.WriteSysfs(root); err != nil {
		t.Fatal(err)
	}
	topo, err := topology.Build(src, topology.Sysfs{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	if len(topo.GPUs) != 7 || len(topo.LostGPUs) != 1 || topo.LostGPUs[0].Index != 2 {
		t.Errorf("GPUs %d, lost %+v; want 7 and GPU 2 lost", len(topo.GPUs), topo.LostGPUs)
	}
	src.err = errors.New("boom")
	if _, err := topology.Build(src, topology.Sysfs{Root: root}); err == nil || !strings.Contains(err.Error(), "MIG layout of GPU 2: boom") {
		t.Errorf("Build with a failing MIG read = %v, want an error naming GPU 2", err)
	}
}

type migFailing struct {
	gpu.Interface
	index int
	err   error
}

func (f *migFailing) MIG(i int) (gpu.MIGInfo, error) {
	if i == f.index {
		return gpu.MIGInfo{}, f.err
	}
	return f.Interface.MIG(i)
}

func openLib(t *testing.T, m *nvmlmock.Machine) gpu.Interface {
	t.Helper()
	lib := gpu.NewNVML(m.NVML())
	if err := lib.Init(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lib.Shutdown() })
	return lib
}
