package nri

import (
	"strings"
	"testing"

	"github.com/containerd/nri/pkg/adaptation"
	"github.com/google/go-cmp/cmp"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/gpu"
	"github.com/tessera-gpu/tessera/gpu/nvmlmock"
	"github.com/tessera-gpu/tessera/topology"
)

// migMachine is the DGX A100 mock with MIG on GPUs 0-3.
func migMachine(t *testing.T) (*nvmlmock.Machine, []GPU) {
	t.Helper()
	m := nvmlmock.DGXA100MIG()
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
	gpus, err := GPUsFromTopology(topo, lib)
	if err != nil {
		t.Fatal(err)
	}
	return m, gpus
}

// Over NRI, on dgx-a100-mig: a container holding a MIG instance gets its
// MIG UUID and its GPU's device node only; the ledger records the
// instance, so another pod's container given it is refused, and a whole
// GPU in MIG mode is refused.
func TestPluginMIGOverNRI(t *testing.T) {
	m, gpus := migMachine(t)
	h := newHarness(t, func(c *Config) { c.GPUs = gpus })
	inst := m.MIGUUIDs(2)[1] // GPU 2's 2g.10gb
	ref := api.MIGRef{UUID: inst, Profile: "2g.10gb", GPU: api.GPURef{UUID: m.UUID(2), Index: 2}}

	migPod := sandbox("mig", annotate(t, api.ContainerAssignment{Name: "infer", MIG: []api.MIGRef{ref}}))
	migCtr := container(migPod, "infer", api.EnvNVIDIAVisibleDevices+"=void")
	h.allocs.set(migPod.Uid, "infer", Devices{MIG: []MIGDevice{{UUID: inst, Profile: "2g.10gb"}}})

	thief := sandbox("thief", nil)
	thiefCtr := container(thief, "c")
	h.allocs.set(thief.Uid, "c", Devices{MIG: []MIGDevice{{UUID: inst, Profile: "2g.10gb"}}})

	whole := sandbox("whole", nil)
	wholeCtr := container(whole, "c")
	h.allocs.set(whole.Uid, "c", Devices{Whole: []string{m.UUID(0)}})

	rt := startRuntime(t, h.dir, nil, nil)
	t.Cleanup(rt.Stop)
	rt.waitPlugin(t)
	h.observer.want(t, true)

	got, err := create(t, rt, migPod, migCtr)
	if err != nil {
		t.Fatalf("CreateContainer of the MIG container: %v", err)
	}
	want := observed{
		Env:         []string{"NVIDIA_VISIBLE_DEVICES=" + inst, "TESSERA_GPU_UUIDS=" + m.UUID(2), "TESSERA_GPU_INDICES=2", "TESSERA_GPU_SHARED=false"},
		Devices:     wantNodes(2),
		CgroupRules: wantRules(2),
		CPUs:        "0-63,128-191", Mems: "0",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("MIG container adjustment (-want +got):\n%s", diff)
	}
	entries := h.plugin.Ledger().Snapshot()
	if len(entries) != 1 || !cmp.Equal(entries[0].MIG, []api.MIGRef{ref}) {
		t.Errorf("ledger %+v, want the MIG container with its instance", entries)
	}
	for _, tc := range []struct {
		name string
		sb   *adaptation.PodSandbox
		c    *adaptation.Container
		want string
	}{
		{"another pod given the same instance", thief, thiefCtr, "already allocated to ns/mig container infer"},
		{"a GPU in MIG mode allocated whole", whole, wholeCtr, "in MIG mode: it serves only as its MIG instances, never whole"},
	} {
		if _, err := create(t, rt, tc.sb, tc.c); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: CreateContainer = %v, want refused with %q", tc.name, err, tc.want)
		}
	}
}
