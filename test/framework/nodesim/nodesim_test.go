package nodesim

import (
	"slices"
	"testing"

	"github.com/containerd/nri/pkg/adaptation"
	"github.com/google/go-cmp/cmp"
)

func TestParseNodes(t *testing.T) {
	got, err := ParseNodes("dgx-a100, dgx-a100,big=dgx-1v")
	if err != nil {
		t.Fatal(err)
	}
	want := []NodeSpec{{Name: "dgx-a100-1", Profile: "dgx-a100"}, {Name: "dgx-a100-2", Profile: "dgx-a100"}, {Name: "big", Profile: "dgx-1v"}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ParseNodes (-want +got):\n%s", diff)
	}
	if _, err := ParseNodes(" , "); err == nil {
		t.Error("no nodes: want an error")
	}
}

// Two nodes of one profile must not share GPU UUIDs (the extender and the
// agents key GPUs by UUID).
func TestMachineUUIDsDifferPerNode(t *testing.T) {
	a, err := MachineUUIDs("dgx-a100", "a100-1")
	if err != nil {
		t.Fatal(err)
	}
	b, err := MachineUUIDs("dgx-a100", "a100-2")
	if err != nil {
		t.Fatal(err)
	}
	if len(a) != 8 || len(b) != 8 {
		t.Fatalf("want 8 GPUs each, got %d and %d", len(a), len(b))
	}
	for _, u := range a {
		if slices.Contains(b, u) {
			t.Errorf("GPU %s is on both nodes", u)
		}
	}
}

func TestRecordRoundTrip(t *testing.T) {
	dir := t.TempDir()
	r := &PodRecord{Namespace: "ns", Name: "p", UID: "u1", Node: "n", Phase: "Running",
		Containers: []ContainerRecord{{Name: "main", ID: "u1-main", Env: map[string]string{"A": "1"}, CPUs: "0-3", Adjusted: true}}}
	if err := writeRecord(dir, r); err != nil {
		t.Fatal(err)
	}
	all, err := ReadRecords(dir)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]*PodRecord{"u1": r}, all); diff != "" {
		t.Errorf("ReadRecords (-want +got):\n%s", diff)
	}
	if got, err := ReadRecord(dir, "u1"); err != nil || got.Container("main").CPUs != "0-3" {
		t.Errorf("ReadRecord: %+v, %v", got, err)
	}
	if err := removeRecord(dir, "u1"); err != nil {
		t.Fatal(err)
	}
	if got, err := ReadRecord(dir, "u1"); err != nil || got != nil {
		t.Errorf("after remove: %+v, %v", got, err)
	}
	if err := removeRecord(dir, "u1"); err != nil {
		t.Errorf("removing twice: %v", err)
	}
}

// applyAdjustment applies an NRI adjustment as the runtime would and
// records it.
func TestApplyAdjustment(t *testing.T) {
	ctr := &adaptation.Container{Linux: &adaptation.LinuxContainer{Resources: &adaptation.LinuxResources{Cpu: &adaptation.LinuxCPU{Cpus: "0-7", Mems: "0,1"}}}}
	env := map[string]string{"NVIDIA_VISIBLE_DEVICES": "void", "KEEP": "x", "DROP": "y"}
	adj := &adaptation.ContainerAdjustment{}
	adj.AddEnv("NVIDIA_VISIBLE_DEVICES", "GPU-1")
	adj.RemoveEnv("DROP")
	adj.AddCDIDevice(&adaptation.CDIDevice{Name: "nvidia.com/gpu=GPU-1"})
	adj.AddDevice(&adaptation.LinuxDevice{Path: "/dev/nvidia1", Type: "c", Major: 195, Minor: 1})
	adj.RemoveDevice("/dev/nvidia0")
	adj.AddMount(&adaptation.Mount{Source: "/pipe", Destination: "/run/tessera/mps"})
	adj.SetLinuxCPUSetCPUs("0-3")
	adj.SetLinuxCPUSetMems("0")
	var cr ContainerRecord
	applyAdjustment(&cr, ctr, env, adj)
	want := ContainerRecord{
		Env:            map[string]string{"NVIDIA_VISIBLE_DEVICES": "GPU-1", "KEEP": "x"},
		CDIDevices:     []string{"nvidia.com/gpu=GPU-1"},
		Devices:        []string{"/dev/nvidia1"},
		RemovedDevices: []string{"/dev/nvidia0"},
		Mounts:         []string{"/pipe -> /run/tessera/mps"},
		CPUs:           "0-3", Mems: "0", Adjusted: true,
	}
	if diff := cmp.Diff(want, cr); diff != "" {
		t.Errorf("record (-want +got):\n%s", diff)
	}
	if got := ctr.Linux.Resources.Cpu.Cpus; got != "0-3" {
		t.Errorf("container cpuset %q, want 0-3", got)
	}
	if !slices.Contains(ctr.Env, "NVIDIA_VISIBLE_DEVICES=GPU-1") || slices.Contains(ctr.Env, "DROP=y") {
		t.Errorf("container env %v", ctr.Env)
	}

	// No adjustment: the runtime's cpuset stays, nothing is recorded as
	// adjusted.
	var none ContainerRecord
	applyAdjustment(&none, ctr, map[string]string{}, nil)
	if none.Adjusted || none.CPUs != "0-3" {
		t.Errorf("without adjustment: %+v", none)
	}
}
