package nri

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/deviceplugin/kubeletstate"
	"github.com/tessera-gpu/tessera/gpu"
	"github.com/tessera-gpu/tessera/gpu/nvmlmock"
	"github.com/tessera-gpu/tessera/gpureq"
	"github.com/tessera-gpu/tessera/topology"
)

const (
	mig0a = "MIG-0000000a-0000-0000-0000-000000000000" // GPU 0, 1g.5gb at 0
	mig0b = "MIG-0000000b-0000-0000-0000-000000000000" // GPU 0, 1g.5gb at 1
	mig1a = "MIG-1000000a-0000-0000-0000-000000000000" // GPU 1, 3g.20gb at 0
	mig1b = "MIG-1000000b-0000-0000-0000-000000000000" // GPU 1, 1g.5gb at 6
)

// migNode is testNode with GPUs 0 and 1 in MIG mode.
func migNode() *Node {
	n := testNode()
	n.GPUs[0].MIGMode = true
	n.GPUs[0].MIG = []MIGInstance{{UUID: mig0a, Profile: "1g.5gb", Start: 0, Size: 1}, {UUID: mig0b, Profile: "1g.5gb", Start: 1, Size: 1}}
	n.GPUs[1].MIGMode = true
	n.GPUs[1].MIG = []MIGInstance{{UUID: mig1a, Profile: "3g.20gb", Start: 0, Size: 4}, {UUID: mig1b, Profile: "1g.5gb", Start: 6, Size: 1}}
	return n
}

func migRef(uuid, profile string, gpu int) api.MIGRef {
	uuids := []string{uuid0, uuid1, uuid2, uuid3}
	return api.MIGRef{UUID: uuid, Profile: profile, GPU: api.GPURef{UUID: uuids[gpu], Index: gpu}}
}

func mig(uuid, profile string) MIGDevice { return MIGDevice{UUID: uuid, Profile: profile} }

func TestDecideMIG(t *testing.T) {
	entry := func(refs ...api.MIGRef) Entry {
		return Entry{PodUID: "uid-p", Namespace: "ns", Pod: "p", Container: "c", MIG: refs}
	}
	migEnv := func(visible, uuids, indices string) []EnvVar {
		return []EnvVar{{api.EnvNVIDIAVisibleDevices, visible}, {api.EnvGPUUUIDs, uuids}, {api.EnvGPUIndices, indices}, {api.EnvGPUShared, "false"}}
	}
	other := Entry{PodUID: "uid-q", Namespace: "ns", Pod: "q", Container: "c", MIG: []api.MIGRef{migRef(mig0b, "1g.5gb", 0)}}
	for _, tc := range []struct {
		name     string
		opts     func(*Options)
		node     func(*Node)
		req      Request
		want     *Decision
		wantErr  string
		wantCode gpureq.Code
	}{
		{
			name: "one instance as device nodes: its GPU's node only, its MIG UUID visible",
			req:  Request{Pod: pod(nil), Container: Container{Name: "c", DeviceNodes: gpuNodes(10, 11, 12)}, Devices: Devices{MIG: []MIGDevice{mig(mig1b, "1g.5gb")}}},
			want: &Decision{Action: ActionIsolate, Entry: entry(migRef(mig1b, "1g.5gb", 1)), Adjustment: Adjustment{
				AddDeviceNodes:    gpuNodes(11),
				RemoveDeviceNodes: []string{"/dev/nvidia10", "/dev/nvidia12"},
				CgroupRules:       gpuRules(11),
				Env:               migEnv(mig1b, uuid1, "1"),
				CPUSetCPUs:        "0-7", CPUSetMems: "0",
			}},
		},
		{
			name: "instances of two GPUs with CDI, recorded by the assignment: CDI names of the MIG UUIDs",
			opts: func(o *Options) { o.CDI = true },
			req: Request{
				Pod:       pod(annotate(t, api.ContainerAssignment{Name: "c", MIG: []api.MIGRef{migRef(mig0a, "1g.5gb", 0), migRef(mig1b, "1g.5gb", 1)}})),
				Container: Container{Name: "c", CDIDevices: []string{"nvidia.com/gpu=" + mig1b}, Env: map[string]string{api.EnvNVIDIAVisibleDevices: "void"}},
				Devices:   Devices{MIG: []MIGDevice{mig(mig1b, "1g.5gb"), mig(mig0a, "1g.5gb")}},
			},
			want: &Decision{Action: ActionIsolate, Entry: entry(migRef(mig0a, "1g.5gb", 0), migRef(mig1b, "1g.5gb", 1)), Adjustment: Adjustment{
				CDIDevices:  []string{"nvidia.com/gpu=" + mig0a},
				CgroupRules: gpuRules(10, 11),
				Env:         migEnv(mig0a+","+mig1b, uuid0+","+uuid1, "0,1"),
				CPUSetCPUs:  "0-7", CPUSetMems: "0",
			}},
		},
		{
			name: "envvar list of the device plugin names the instance",
			req:  Request{Pod: pod(nil), Container: Container{Name: "c", Env: map[string]string{api.EnvNVIDIAVisibleDevices: mig1a}}, Devices: Devices{MIG: []MIGDevice{mig(mig1a, "3g.20gb")}}},
			want: &Decision{Action: ActionIsolate, Entry: entry(migRef(mig1a, "3g.20gb", 1)), Adjustment: Adjustment{
				AddDeviceNodes: gpuNodes(11), CgroupRules: gpuRules(11), Env: migEnv(mig1a, uuid1, "1"), CPUSetCPUs: "0-7", CPUSetMems: "0",
			}},
		},
		{
			name:    "envvar list names another instance",
			req:     Request{Pod: pod(nil), Container: Container{Name: "c", Env: map[string]string{api.EnvNVIDIAVisibleDevices: mig0a}}, Devices: Devices{MIG: []MIGDevice{mig(mig1a, "3g.20gb")}}},
			wantErr: "NVIDIA_VISIBLE_DEVICES=" + mig0a + " from the device plugin does not match the container's devices [" + mig1a + "]",
		},
		{
			name:    "CDI device of another instance",
			req:     Request{Pod: pod(nil), Container: Container{Name: "c", CDIDevices: []string{"nvidia.com/gpu=" + mig0b}}, Devices: Devices{MIG: []MIGDevice{mig(mig0a, "1g.5gb")}}},
			wantErr: "CDI device nvidia.com/gpu=" + mig0b + " is MIG instance " + mig0b + ", which is not one of the container's devices",
		},
		{
			name:    "CDI device of the parent GPU",
			req:     Request{Pod: pod(nil), Container: Container{Name: "c", CDIDevices: []string{"nvidia.com/gpu=" + uuid0}}, Devices: Devices{MIG: []MIGDevice{mig(mig0a, "1g.5gb")}}},
			wantErr: "CDI device nvidia.com/gpu=" + uuid0 + " is GPU " + uuid0 + ", which is not one of the container's devices",
		},
		{
			name:    "the assignment records other instances",
			req:     Request{Pod: pod(annotate(t, api.ContainerAssignment{Name: "c", MIG: []api.MIGRef{migRef(mig0b, "1g.5gb", 0)}})), Container: Container{Name: "c"}, Devices: Devices{MIG: []MIGDevice{mig(mig0a, "1g.5gb")}}},
			wantErr: "the assignment annotation and the kubelet disagree on the container's MIG instances: annotation [" + mig0b + "], kubelet [" + mig0a + "]",
		},
		{
			name:    "the assignment records another GPU for the instance",
			req:     Request{Pod: pod(annotate(t, api.ContainerAssignment{Name: "c", MIG: []api.MIGRef{migRef(mig0a, "1g.5gb", 2)}})), Container: Container{Name: "c"}, Devices: Devices{MIG: []MIGDevice{mig(mig0a, "1g.5gb")}}},
			wantErr: "this node says a 1g.5gb of GPU " + uuid0,
		},
		{
			name:    "the assignment records instances the kubelet did not allocate",
			req:     Request{Pod: pod(annotate(t, api.ContainerAssignment{Name: "c", MIG: []api.MIGRef{migRef(mig0a, "1g.5gb", 0)}})), Container: Container{Name: "c"}, Devices: Devices{MemoryUnits: 1}},
			wantErr: "disagree on the container's MIG instances: annotation [" + mig0a + "], kubelet []",
		},
		{
			name:    "unknown instance",
			req:     Request{Pod: pod(nil), Container: Container{Name: "c"}, Devices: Devices{MIG: []MIGDevice{mig("MIG-99999999-0000-0000-0000-000000000000", "1g.5gb")}}},
			wantErr: "not a MIG instance of this node",
		},
		{
			name:    "instance of another profile than its resource",
			req:     Request{Pod: pod(nil), Container: Container{Name: "c"}, Devices: Devices{MIG: []MIGDevice{mig(mig1a, "1g.5gb")}}},
			wantErr: "allocated it as tessera.dev/mig-1g.5gb but it is a 3g.20gb instance",
		},
		{
			name:    "twice",
			req:     Request{Pod: pod(nil), Container: Container{Name: "c"}, Devices: Devices{MIG: []MIGDevice{mig(mig0a, "1g.5gb"), mig(mig0a, "1g.5gb")}}},
			wantErr: "allocated twice",
		},
		{
			name:    "unhealthy GPU",
			node:    func(n *Node) { n.Unhealthy = map[string]string{uuid0: "XID 79"} },
			req:     Request{Pod: pod(nil), Container: Container{Name: "c"}, Devices: Devices{MIG: []MIGDevice{mig(mig0a, "1g.5gb")}}},
			wantErr: "GPU " + mig0a + ": its GPU " + uuid0 + " is unhealthy: XID 79",
		},
		{
			name:    "another pod's instance",
			node:    func(n *Node) { n.Ledger = []Entry{other} },
			req:     Request{Pod: pod(nil), Container: Container{Name: "c"}, Devices: Devices{MIG: []MIGDevice{mig(mig0b, "1g.5gb")}}},
			wantErr: "already allocated to ns/q container c",
		},
		{
			name:     "MIG and a whole GPU",
			req:      Request{Pod: pod(nil), Container: Container{Name: "c"}, Devices: Devices{Whole: []string{uuid2}, MIG: []MIGDevice{mig(mig0a, "1g.5gb")}}},
			wantCode: gpureq.CodeMIGAndOther,
			wantErr:  "holds MIG instances",
		},
		{
			name:    "a GPU in MIG mode allocated whole",
			req:     Request{Pod: pod(nil), Container: Container{Name: "c"}, Devices: Devices{Whole: []string{uuid0}}},
			wantErr: "GPU " + uuid0 + ": in MIG mode: it serves only as its MIG instances, never whole",
		},
		{
			name:    "a GPU in MIG mode assigned shared units",
			req:     Request{Pod: pod(annotate(t, api.ContainerAssignment{Name: "c", Shared: &api.SharedGPU{GPU: api.GPURef{UUID: uuid1, Index: 1}, MemoryMiB: 1024}})), Container: Container{Name: "c"}, Devices: Devices{MemoryUnits: 1}},
			wantErr: "in MIG mode: it serves only as its MIG instances, never shared units",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := testOptions(t)
			if tc.opts != nil {
				tc.opts(&opts)
			}
			node := migNode()
			if tc.node != nil {
				tc.node(node)
			}
			got, err := Decide(opts, node, tc.req)
			if tc.wantErr != "" {
				var de *DecisionError
				if !errors.As(err, &de) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Decide = %+v, %v; want a *DecisionError containing %q", got, err, tc.wantErr)
				}
				if de.Pod != "ns/p" || de.Container != "c" {
					t.Errorf("error names pod %q container %q", de.Pod, de.Container)
				}
				if tc.wantCode != "" && de.Code != tc.wantCode {
					t.Errorf("code %q, want %q", de.Code, tc.wantCode)
				}
				return
			}
			if err != nil {
				t.Fatalf("Decide: %v", err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Decide (-want +got):\n%s", diff)
			}
		})
	}
}

// Shared slices placed locally never land on a GPU in MIG mode, and its
// memory counts in no slice base.
func TestSharedAvoidsMIGGPUs(t *testing.T) {
	node := migNode()
	opts := testOptions(t)
	for i := 0; i < 2; i++ {
		d, err := Decide(opts, node, Request{Pod: Pod{Namespace: "ns", Name: "p", UID: "uid-" + string(rune('a'+i))}, Container: Container{Name: "c"}, Devices: Devices{MemoryUnits: 8}})
		if err != nil {
			t.Fatal(err)
		}
		if g := d.Entry.Shared.GPU.Index; g != 2 && g != 3 {
			t.Errorf("slice placed on GPU %d, in MIG mode", g)
		}
		node.Ledger = append(node.Ledger, d.Entry)
	}
	node.GPUs[2].MIGMode, node.GPUs[3].MIGMode = true, true
	if _, err := Decide(opts, node, Request{Pod: pod(nil), Container: Container{Name: "c"}, Devices: Devices{MemoryUnits: 1}}); err == nil {
		t.Error("a slice was placed on a node whose GPUs are all in MIG mode")
	}
	if got := sliceBaseMiB(opts, node); got != 0 {
		t.Errorf("slice base %d MiB on a node without a shared GPU, want 0", got)
	}
}

func TestContainerDevicesReadsMIG(t *testing.T) {
	allocs := []kubeletstate.ContainerDevices{
		{Namespace: "ns", Name: "p", Container: "c", Resource: api.MIGResource("1g.5gb"), DeviceIDs: []string{mig0a, mig1b}},
		{Namespace: "ns", Name: "p", Container: "c", Resource: api.MIGResource("3g.20gb"), DeviceIDs: []string{mig1a}},
		{Namespace: "ns", Name: "p", Container: "d", Resource: api.MIGResource("1g.5gb"), DeviceIDs: []string{mig0b}},
		{PodUID: "uid-p", Container: "c", Resource: "example.com/mig-1g.5gb", DeviceIDs: []string{mig0b}},
	}
	want := Devices{MIG: []MIGDevice{mig(mig0a, "1g.5gb"), mig(mig1b, "1g.5gb"), mig(mig1a, "3g.20gb")}}
	got := containerDevices(allocs, pod(nil), "c")
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("containerDevices (-want +got):\n%s", diff)
	}
	if got.Empty() {
		t.Error("a container with MIG instances counts as holding nothing")
	}
}

// The plugin's GPUs carry their MIG layout from the topology, so that the
// minors a MIG container gets are its GPU's.
func TestGPUsFromTopologyWithMIG(t *testing.T) {
	m := nvmlmock.DGXA100MIG()
	lib := gpu.NewNVML(m.NVML())
	if err := lib.Init(); err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	if err := m.WriteSysfs(root); err != nil {
		t.Fatal(err)
	}
	topo, err := topology.Build(lib, topology.Sysfs{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	gpus, err := GPUsFromTopology(topo, lib)
	if err != nil {
		t.Fatal(err)
	}
	node := &Node{GPUs: gpus}
	for i := range gpus {
		if want := i < 4; gpus[i].MIGMode != want {
			t.Errorf("GPU %d MIG mode %v, want %v", i, gpus[i].MIGMode, want)
		}
		for k, uuid := range m.MIGUUIDs(i) {
			g, in, ok := node.MIGInstance(uuid)
			if !ok || g.Index != i || g.Minor != i || in.Profile != m.Profile().GPUs[i].MIG.Instances[k].Profile {
				t.Errorf("MIG instance %s: GPU %d minor %d, %+v, found %v", uuid, g.Index, g.Minor, in, ok)
			}
		}
	}
}
