package numareport

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/utils/cpuset"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/gpu/nvmlmock"
	"github.com/tessera-gpu/tessera/topology"
)

// numaNodes are a mock machine's NUMA nodes as topology.Build reports them.
func numaNodes(t *testing.T, profile string) ([]topology.NUMANode, cpuset.CPUSet) {
	t.Helper()
	m, err := nvmlmock.Load(profile)
	if err != nil {
		t.Fatal(err)
	}
	all := cpuset.New()
	var out []topology.NUMANode
	for _, n := range m.NUMANodes {
		out = append(out, topology.NUMANode{ID: n.ID, CPUs: n.CPUs})
		all = all.Union(mustParse(n.CPUs))
	}
	return out, all
}

var singleNUMA = KubeletConfig{TopologyManagerPolicy: api.TopologyPolicySingleNUMANode, TopologyManagerScope: api.TopologyScopePod, CPUManagerPolicy: api.CPUManagerPolicyStatic}

func TestBuildOnMockMachines(t *testing.T) {
	a100, all := numaNodes(t, "dgx-a100") // NUMA 0: 0-63,128-191; 1: 64-127,192-255
	snap := Snapshot{
		Source:      api.NUMASourcePodResources,
		Allocatable: all.Difference(cpuset.New(0)), // CPU 0 reserved
		Pods: []PodHold{
			{Namespace: "a", Name: "big", CPUs: mustParse("1-63,128-164")}, // 100 on NUMA 0
			{Namespace: "a", Name: "small", CPUs: mustParse("64-67")},      // 4 on NUMA 1
			{Namespace: "a", Name: "reserved-only", CPUs: cpuset.New(0)},   // not allocatable: left out
		},
	}
	got, err := Build(singleNUMA, a100, snap)
	if err != nil {
		t.Fatal(err)
	}
	want := &api.NUMATopology{
		APIVersion: api.Version, Kind: api.KindNUMATopology,
		TopologyManagerPolicy: "single-numa-node", TopologyManagerScope: "pod", CPUManagerPolicy: "static", Source: "podresources",
		Zones: []api.NUMAZone{{ID: 0, CPUs: 127, FreeCPUs: 27}, {ID: 1, CPUs: 128, FreeCPUs: 124}},
		Pods: []api.NUMAPodUse{
			{Namespace: "a", Name: "big", Zones: []api.NUMAZoneUse{{ID: 0, CPUs: 100}}},
			{Namespace: "a", Name: "small", Zones: []api.NUMAZoneUse{{ID: 1, CPUs: 4}}},
		},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Build (-want +got):\n%s", diff)
	}
	if _, err := api.EncodeNUMATopology(got); err != nil {
		t.Errorf("the report does not encode: %v", err)
	}

	// pcie-2numa, with memory pinned by the memory manager.
	pcie, all := numaNodes(t, "pcie-2numa")
	got, err = Build(singleNUMA, pcie, Snapshot{Source: api.NUMASourcePodResources, Allocatable: all, MemMiB: map[int]int64{0: 1000, 1: 2000},
		Pods: []PodHold{{UID: "u1", CPUs: mustParse("32-35"), MemMiB: map[int]int64{1: 500}}}})
	if err != nil {
		t.Fatal(err)
	}
	wantZones := []api.NUMAZone{{ID: 0, CPUs: 64, FreeCPUs: 64, MemoryMiB: 1000, FreeMemoryMiB: 1000}, {ID: 1, CPUs: 64, FreeCPUs: 60, MemoryMiB: 2000, FreeMemoryMiB: 1500}}
	if diff := cmp.Diff(wantZones, got.Zones); diff != "" {
		t.Errorf("pcie-2numa zones (-want +got):\n%s", diff)
	}

	// The kubelet reporting more held than allocatable is refused, not
	// published.
	if _, err := Build(singleNUMA, pcie, Snapshot{Source: api.NUMASourcePodResources, Allocatable: cpuset.New(0, 1), Pods: []PodHold{{UID: "u", CPUs: cpuset.New(0, 1)}, {UID: "v", CPUs: cpuset.New(1)}}}); err == nil {
		t.Error("Build accepted more CPUs held than allocatable")
	}
	if _, err := Build(KubeletConfig{TopologyManagerPolicy: "strict", TopologyManagerScope: "pod", CPUManagerPolicy: "none"}, pcie, Snapshot{Source: api.NUMASourcePodResources}); err == nil {
		t.Error("Build accepted an unknown policy")
	}
}

func TestLoadKubeletConfig(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cfg, found, err := LoadKubeletConfig(filepath.Join(dir, "missing"))
	if err != nil || found || cfg.TopologyManagerPolicy != "none" || cfg.CPUManagerPolicy != "none" || cfg.TopologyManagerScope != "container" {
		t.Errorf("missing file: %+v %v %v", cfg, found, err)
	}
	cfg, found, err = LoadKubeletConfig(write("ok.yaml", `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cpuManagerPolicy: static
topologyManagerPolicy: single-numa-node
topologyManagerScope: pod
kubeReserved: {cpu: 500m, memory: 1Gi}
systemReserved: {cpu: "1"}
`))
	if err != nil || !found {
		t.Fatal(err)
	}
	if diff := cmp.Diff(KubeletConfig{TopologyManagerPolicy: "single-numa-node", TopologyManagerScope: "pod", CPUManagerPolicy: "static", ReservedCount: 2}, cfg, cmp.Comparer(func(a, b cpuset.CPUSet) bool { return a.Equals(b) })); diff != "" {
		t.Errorf("config (-want +got):\n%s", diff)
	}
	for name, body := range map[string]string{
		"bad-policy.yaml": "topologyManagerPolicy: strict\n",
		"bad-kind.yaml":   "kind: Pod\n",
		"bad-cpus.yaml":   "reservedSystemCPUs: 0-x\n",
		"bad-yaml.yaml":   "{",
	} {
		if _, _, err := LoadKubeletConfig(write(name, body)); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestCheckpoint(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "cpu_manager_state")
	write := func(body string) {
		if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	_, all := numaNodes(t, "pcie-2numa")
	c := &Checkpoint{Path: path, All: all, Config: KubeletConfig{ReservedCount: 2}}
	write(`{"policyName":"static","defaultCpuSet":"0-31,36-127","entries":{"uid-1":{"main":"32-35"}},"checksum":1}`)
	snap, err := c.Read(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if snap.Source != api.NUMASourceCPUManagerState || snap.CPUManagerPolicy != "static" || !snap.Allocatable.Equals(all.Difference(cpuset.New(0, 1))) {
		t.Errorf("snapshot = %+v", snap)
	}
	if len(snap.Pods) != 1 || snap.Pods[0].UID != "uid-1" || !snap.Pods[0].CPUs.Equals(mustParse("32-35")) {
		t.Errorf("pods = %+v", snap.Pods)
	}
	write(`{"policyName":"none","defaultCpuSet":"","checksum":1}`)
	if snap, err = c.Read(context.Background()); err != nil || snap.CPUManagerPolicy != "none" || snap.Allocatable.Size() != 0 {
		t.Errorf("policy none: %+v %v", snap, err)
	}
	for _, bad := range []string{`{`, `{"policyName":"static","entries":{"u":{"c":"x"}}}`} {
		write(bad)
		if _, err := c.Read(context.Background()); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
	os.Remove(path)
	if _, err := c.Read(context.Background()); err == nil {
		t.Error("missing checkpoint: no error")
	}
}

func mustParse(s string) cpuset.CPUSet {
	c, err := cpuset.Parse(s)
	if err != nil {
		panic(err)
	}
	return c
}

type fakeReader struct {
	snap Snapshot
	err  error
}

func (f fakeReader) Read(context.Context) (Snapshot, error) { return f.snap, f.err }
func (f fakeReader) Name() string                           { return "fake" }

type fakePublisher struct{ got []*api.NUMATopology }

func (f *fakePublisher) PublishNUMATopology(_ context.Context, t *api.NUMATopology) error {
	f.got = append(f.got, t)
	return nil
}

func TestReporterOnce(t *testing.T) {
	nodes, all := numaNodes(t, "pcie-2numa")
	pub := &fakePublisher{}
	r := &Reporter{Config: singleNUMA, NUMANodes: nodes, Publisher: pub,
		Reader: First{fakeReader{err: errors.New("no socket")}, fakeReader{snap: Snapshot{Source: api.NUMASourceCPUManagerState, Allocatable: all}}}}
	if err := r.Once(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(pub.got) != 1 || pub.got[0].Source != api.NUMASourceCPUManagerState || pub.got[0].Zones[1].FreeCPUs != 64 {
		t.Fatalf("published %+v", pub.got)
	}
	r.Reader = First{fakeReader{err: errors.New("no socket")}, fakeReader{err: errors.New("no file")}}
	err := r.Once(context.Background())
	if err == nil || !strings.Contains(err.Error(), "no socket") || !strings.Contains(err.Error(), "no file") {
		t.Errorf("Once = %v, want both sources' errors", err)
	}
	if len(pub.got) != 1 {
		t.Error("published without a snapshot")
	}
}
