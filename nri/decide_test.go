package nri

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tessera-gpu/tessera/allocator"
	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/gpureq"
	"github.com/tessera-gpu/tessera/topology"
)

const (
	uuid0 = "GPU-00000000-0000-0000-0000-000000000000"
	uuid1 = "GPU-11111111-1111-1111-1111-111111111111"
	uuid2 = "GPU-22222222-2222-2222-2222-222222222222"
	uuid3 = "GPU-33333333-3333-3333-3333-333333333333"
	uuidX = "GPU-99999999-9999-9999-9999-999999999999"
)

// testNode has four 16 GiB GPUs, two per NUMA node; minors differ from
// indices to catch mix-ups.
func testNode() *Node {
	return &Node{
		GPUs: []GPU{
			{Index: 0, UUID: uuid0, Minor: 10, NUMANode: 0, MemoryMiB: 16384},
			{Index: 1, UUID: uuid1, Minor: 11, NUMANode: 0, MemoryMiB: 16384},
			{Index: 2, UUID: uuid2, Minor: 12, NUMANode: 1, MemoryMiB: 16384},
			{Index: 3, UUID: uuid3, Minor: 13, NUMANode: 1, MemoryMiB: 16384},
		},
		NUMANodes: []topology.NUMANode{{ID: 0, CPUs: "0-7"}, {ID: 1, CPUs: "8-15"}},
	}
}

func testOptions(t *testing.T) Options {
	t.Helper()
	p, err := allocator.NewPolicy(allocator.PolicyBestFit)
	if err != nil {
		t.Fatal(err)
	}
	return Options{
		MemoryUnitMiB:    1024,
		MemoryReserveMiB: 1024,
		CDIKind:          api.DefaultCDIKind,
		CDIDeviceName:    api.CDINameUUID,
		UVMMajor:         510,
		MPSPipeDir:       func(uuid string) string { return "/run/tessera/mps/" + uuid + "/pipe" },
		Policy:           p,
	}
}

func annotate(t *testing.T, cs ...api.ContainerAssignment) map[string]string {
	t.Helper()
	a := api.NewAssignment()
	a.Containers = cs
	m := map[string]string{}
	if err := api.SetAssignment(m, a); err != nil {
		t.Fatal(err)
	}
	return m
}

func pod(ann map[string]string) Pod {
	return Pod{Namespace: "ns", Name: "p", UID: "uid-p", Annotations: ann}
}

// Rules and nodes every GPU container gets, for the given minors.
func gpuRules(minors ...int64) []CgroupRule {
	rules := []CgroupRule{
		{Allow: false, Type: "c", Major: i64(195), Access: "rwm"},
		{Allow: false, Type: "c", Major: i64(510), Access: "rwm"},
	}
	for _, m := range minors {
		rules = append(rules, CgroupRule{Allow: true, Type: "c", Major: i64(195), Minor: i64(m), Access: "rw"})
	}
	return append(rules,
		CgroupRule{Allow: true, Type: "c", Major: i64(195), Minor: i64(255), Access: "rw"},
		CgroupRule{Allow: true, Type: "c", Major: i64(510), Minor: i64(0), Access: "rw"},
		CgroupRule{Allow: true, Type: "c", Major: i64(510), Minor: i64(1), Access: "rw"},
	)
}

func gpuNodes(minors ...int64) []DeviceNode {
	var out []DeviceNode
	for _, m := range minors {
		out = append(out, DeviceNode{Path: "/dev/nvidia" + strconv.FormatInt(m, 10), Type: "c", Major: 195, Minor: m})
	}
	return append(out,
		DeviceNode{Path: "/dev/nvidiactl", Type: "c", Major: 195, Minor: 255},
		DeviceNode{Path: "/dev/nvidia-uvm", Type: "c", Major: 510, Minor: 0},
		DeviceNode{Path: "/dev/nvidia-uvm-tools", Type: "c", Major: 510, Minor: 1},
	)
}

func sharedEnv(uuid, index, memMiB, cores string) []EnvVar {
	env := []EnvVar{
		{api.EnvNVIDIAVisibleDevices, uuid},
		{api.EnvGPUUUIDs, uuid},
		{api.EnvGPUIndices, index},
		{api.EnvGPUShared, "true"},
		{api.EnvMPSPipeDirectory, api.MPSPipeMountPath},
		{api.EnvMPSPinnedDeviceMemLimit, "0=" + memMiB + "M"},
		{api.EnvGPUMemoryLimitMiB, memMiB},
	}
	if cores != "" {
		env = append(env, EnvVar{api.EnvMPSActiveThreadPercentage, cores}, EnvVar{api.EnvGPUCores, cores})
	}
	return env
}

func mpsMount(uuid string) []Mount {
	return []Mount{{Source: "/run/tessera/mps/" + uuid + "/pipe", Destination: api.MPSPipeMountPath, Options: []string{"rbind", "rw"}}}
}

func TestDecide(t *testing.T) {
	sharedOn := func(uuid string, index int, mem, cores int64) api.ContainerAssignment {
		return api.ContainerAssignment{Name: "c", Shared: &api.SharedGPU{GPU: api.GPURef{UUID: uuid, Index: index}, MemoryMiB: mem, Cores: cores}}
	}
	other := func(name string, shared *api.SharedGPU, whole ...api.GPURef) Entry {
		return Entry{PodUID: "uid-" + name, Namespace: "ns", Pod: name, Container: "c", ContainerID: "id-" + name, GPUs: whole, Shared: shared}
	}
	for _, tc := range []struct {
		name    string
		opts    func(*Options)
		node    func(*Node)
		req     Request
		want    *Decision
		wantErr string // substring of the error; "" for success
		// wantCode is the request model's refusal code of the error, when
		// set.
		wantCode gpureq.Code
	}{
		{
			name: "container without Tessera resources gets no GPU",
			req:  Request{Pod: pod(nil), Container: Container{ID: "id", Name: "c"}},
			want: &Decision{Action: ActionVoid, Adjustment: Adjustment{
				CgroupRules: voidRules(),
				Env:         []EnvVar{{api.EnvNVIDIAVisibleDevices, "void"}},
			}},
		},
		{
			name: "whole GPUs as device nodes, other GPU's node removed, NUMA cpuset",
			req: Request{
				Pod: pod(nil),
				Container: Container{ID: "id", Name: "c",
					Env:               map[string]string{api.EnvNVIDIAVisibleDevices: uuid2 + "," + uuid3},
					MountDestinations: []string{api.NVIDIAVolumeMountsDir + "/" + uuid3, api.NVIDIAVolumeMountsDir + "/" + uuid2},
					DeviceNodes:       []DeviceNode{{Path: "/dev/nvidia10", Type: "c", Major: 195, Minor: 10}, {Path: "/dev/null", Type: "c", Major: 1, Minor: 3}}},
				Devices: Devices{Whole: []string{uuid3, uuid2}},
			},
			want: &Decision{
				Action: ActionIsolate,
				Entry: Entry{PodUID: "uid-p", Namespace: "ns", Pod: "p", Container: "c", ContainerID: "id",
					GPUs: []api.GPURef{{UUID: uuid2, Index: 2}, {UUID: uuid3, Index: 3}}},
				Adjustment: Adjustment{
					AddDeviceNodes:    gpuNodes(12, 13),
					RemoveDeviceNodes: []string{"/dev/nvidia10"},
					CgroupRules:       gpuRules(12, 13),
					Env: []EnvVar{
						{api.EnvNVIDIAVisibleDevices, uuid2 + "," + uuid3},
						{api.EnvGPUUUIDs, uuid2 + "," + uuid3},
						{api.EnvGPUIndices, "2,3"},
						{api.EnvGPUShared, "false"},
					},
					CPUSetCPUs: "8-15", CPUSetMems: "1",
				},
			},
		},
		{
			name: "a GPU container's other device-requesting variables name only its own devices",
			req: Request{
				Pod: pod(nil),
				Container: Container{ID: "id", Name: "c",
					Env: map[string]string{api.EnvNVIDIAVisibleDevices: "all", api.EnvDockerResourceGPU: "0,1,2,3,4,5,6,7",
						api.EnvNVIDIAIMEXChannels: "all", api.EnvNVIDIAMIGConfigDevices: "all", api.EnvNVIDIAMIGMonitorDevices: "all"}},
				Devices: Devices{Whole: []string{uuid2}},
			},
			want: &Decision{
				Action: ActionIsolate,
				Entry:  Entry{PodUID: "uid-p", Namespace: "ns", Pod: "p", Container: "c", ContainerID: "id", GPUs: []api.GPURef{{UUID: uuid2, Index: 2}}},
				Adjustment: Adjustment{
					AddDeviceNodes: gpuNodes(12),
					CgroupRules:    gpuRules(12),
					Env: []EnvVar{
						{api.EnvNVIDIAVisibleDevices, uuid2},
						{api.EnvGPUUUIDs, uuid2},
						{api.EnvGPUIndices, "2"},
						{api.EnvGPUShared, "false"},
						{api.EnvDockerResourceGPU, uuid2},
						{api.EnvNVIDIAIMEXChannels, ""},
						{api.EnvNVIDIAMIGConfigDevices, ""},
						{api.EnvNVIDIAMIGMonitorDevices, ""},
					},
					CPUSetCPUs: "8-15", CPUSetMems: "1",
				},
			},
		},
		{
			name: "whole GPUs with CDI: only missing CDI devices are added; cpuset within the kubelet's",
			opts: func(o *Options) { o.CDI = true },
			req: Request{
				Pod: pod(annotate(t, api.ContainerAssignment{Name: "c", GPUs: []api.GPURef{{UUID: uuid0, Index: 0}, {UUID: uuid2, Index: 2}}})),
				Container: Container{ID: "id", Name: "c", CPUs: "4-11",
					Env:        map[string]string{api.EnvNVIDIAVisibleDevices: "void"},
					CDIDevices: []string{"nvidia.com/gpu=" + uuid0}},
				Devices: Devices{Whole: []string{uuid0, uuid2}},
			},
			want: &Decision{
				Action: ActionIsolate,
				Entry: Entry{PodUID: "uid-p", Namespace: "ns", Pod: "p", Container: "c", ContainerID: "id",
					GPUs: []api.GPURef{{UUID: uuid0, Index: 0}, {UUID: uuid2, Index: 2}}},
				Adjustment: Adjustment{
					CDIDevices:  []string{"nvidia.com/gpu=" + uuid2},
					CgroupRules: gpuRules(10, 12),
					Env: []EnvVar{
						{api.EnvNVIDIAVisibleDevices, uuid0 + "," + uuid2},
						{api.EnvGPUUUIDs, uuid0 + "," + uuid2},
						{api.EnvGPUIndices, "0,2"},
						{api.EnvGPUShared, "false"},
					},
					CPUSetCPUs: "4-11", CPUSetMems: "0-1",
				},
			},
		},
		{
			name: "the device plugin's sentinel mount is taken out of a container it isolates",
			opts: func(o *Options) { o.CDI = true },
			req: Request{
				Pod: pod(annotate(t, api.ContainerAssignment{Name: "c", GPUs: []api.GPURef{{UUID: uuid0, Index: 0}}})),
				Container: Container{ID: "id", Name: "c", CPUs: "4-11",
					Env:               map[string]string{api.EnvNVIDIAVisibleDevices: "void"},
					CDIDevices:        []string{"nvidia.com/gpu=" + uuid0},
					MountDestinations: []string{"/etc/hosts", api.NRISentinelPath}},
				Devices: Devices{Whole: []string{uuid0}},
			},
			want: &Decision{
				Action: ActionIsolate,
				Entry: Entry{PodUID: "uid-p", Namespace: "ns", Pod: "p", Container: "c", ContainerID: "id",
					GPUs: []api.GPURef{{UUID: uuid0, Index: 0}}},
				Adjustment: Adjustment{
					CgroupRules: gpuRules(10),
					Env: []EnvVar{
						{api.EnvNVIDIAVisibleDevices, uuid0},
						{api.EnvGPUUUIDs, uuid0},
						{api.EnvGPUIndices, "0"},
						{api.EnvGPUShared, "false"},
					},
					RemoveMounts: []string{api.NRISentinelPath},
					CPUSetCPUs:   "4-7", CPUSetMems: "0",
				},
			},
		},
		{
			name: "shared slice from the extender's assignment",
			req: Request{
				Pod:       pod(annotate(t, sharedOn(uuid1, 1, 3000, 30))),
				Container: Container{ID: "id", Name: "c", Env: map[string]string{api.EnvNVIDIAVisibleDevices: "void"}},
				Devices:   Devices{MemoryUnits: 3, CoreUnits: 30},
			},
			want: &Decision{
				Action: ActionIsolate,
				Entry: Entry{PodUID: "uid-p", Namespace: "ns", Pod: "p", Container: "c", ContainerID: "id",
					Shared: &api.SharedGPU{GPU: api.GPURef{UUID: uuid1, Index: 1}, MemoryMiB: 3000, Cores: 30}},
				Adjustment: Adjustment{
					AddDeviceNodes: gpuNodes(11),
					CgroupRules:    gpuRules(11),
					Env:            sharedEnv(uuid1, "1", "3000", "30"),
					Mounts:         mpsMount(uuid1),
					CPUSetCPUs:     "0-7", CPUSetMems: "0",
				},
			},
		},
		{
			name: "shared slice without core units: memory limit only; exclusive CPUs keep their cpuset",
			req: Request{
				Pod:       pod(annotate(t, sharedOn(uuid1, 1, 2048, 0))),
				Container: Container{ID: "id", Name: "c", ExclusiveCPUs: true},
				Devices:   Devices{MemoryUnits: 2},
			},
			want: &Decision{
				Action: ActionIsolate,
				Entry: Entry{PodUID: "uid-p", Namespace: "ns", Pod: "p", Container: "c", ContainerID: "id",
					Shared: &api.SharedGPU{GPU: api.GPURef{UUID: uuid1, Index: 1}, MemoryMiB: 2048}},
				Adjustment: Adjustment{
					AddDeviceNodes: gpuNodes(11),
					CgroupRules:    gpuRules(11),
					Env:            sharedEnv(uuid1, "1", "2048", ""),
					Mounts:         mpsMount(uuid1),
				},
			},
		},
		{
			name: "core-only slice from the extender's assignment: memory limit cores% of the node's slice base",
			req: Request{
				Pod:       pod(annotate(t, sharedOn(uuid1, 1, 1536, 10))),
				Container: Container{ID: "id", Name: "c"},
				Devices:   Devices{CoreUnits: 10},
			},
			want: &Decision{
				Action: ActionIsolate,
				Entry: Entry{PodUID: "uid-p", Namespace: "ns", Pod: "p", Container: "c", ContainerID: "id",
					Shared: &api.SharedGPU{GPU: api.GPURef{UUID: uuid1, Index: 1}, MemoryMiB: 1536, Cores: 10}},
				Adjustment: Adjustment{
					AddDeviceNodes: gpuNodes(11),
					CgroupRules:    gpuRules(11),
					Env:            sharedEnv(uuid1, "1", "1536", "10"),
					Mounts:         mpsMount(uuid1),
					CPUSetCPUs:     "0-7", CPUSetMems: "0",
				},
			},
		},
		{
			name: "core-only slice placed locally: the same default memory",
			node: func(n *Node) {
				n.Ledger = []Entry{
					other("a", &api.SharedGPU{GPU: api.GPURef{UUID: uuid3, Index: 3}, MemoryMiB: 4096, Cores: 50}),
					other("b", nil, api.GPURef{UUID: uuid0, Index: 0}),
				}
			},
			req: Request{Pod: pod(nil), Container: Container{ID: "id", Name: "c"}, Devices: Devices{CoreUnits: 30}},
			want: &Decision{
				Action: ActionIsolate,
				Entry: Entry{PodUID: "uid-p", Namespace: "ns", Pod: "p", Container: "c", ContainerID: "id",
					Shared: &api.SharedGPU{GPU: api.GPURef{UUID: uuid3, Index: 3}, MemoryMiB: 4608, Cores: 30}},
				PlacedLocally: true,
				Adjustment: Adjustment{
					AddDeviceNodes: gpuNodes(13),
					CgroupRules:    gpuRules(13),
					Env:            sharedEnv(uuid3, "3", "4608", "30"),
					Mounts:         mpsMount(uuid3),
					CPUSetCPUs:     "8-15", CPUSetMems: "1",
				},
			},
		},
		{
			name: "NUMA opt-out by annotation",
			req: Request{
				Pod: func() Pod {
					p := pod(annotate(t, sharedOn(uuid2, 2, 1024, 10)))
					p.Annotations[api.AnnotationNUMAAlignment] = "false"
					return p
				}(),
				Container: Container{ID: "id", Name: "c"},
				Devices:   Devices{MemoryUnits: 1, CoreUnits: 10},
			},
			want: &Decision{
				Action: ActionIsolate,
				Entry: Entry{PodUID: "uid-p", Namespace: "ns", Pod: "p", Container: "c", ContainerID: "id",
					Shared: &api.SharedGPU{GPU: api.GPURef{UUID: uuid2, Index: 2}, MemoryMiB: 1024, Cores: 10}},
				Adjustment: Adjustment{
					AddDeviceNodes: gpuNodes(12),
					CgroupRules:    gpuRules(12),
					Env:            sharedEnv(uuid2, "2", "1024", "10"),
					Mounts:         mpsMount(uuid2),
				},
			},
		},
		{
			name: "bypassed the extender: placed locally (best fit: the fullest GPU that fits) from the kubelet's units",
			node: func(n *Node) {
				n.Ledger = []Entry{
					other("a", &api.SharedGPU{GPU: api.GPURef{UUID: uuid3, Index: 3}, MemoryMiB: 4096, Cores: 50}),
					other("b", nil, api.GPURef{UUID: uuid0, Index: 0}),
				}
			},
			req: Request{
				Pod:       pod(nil),
				Container: Container{ID: "id", Name: "c"},
				Devices:   Devices{MemoryUnits: 4, CoreUnits: 20},
			},
			want: &Decision{
				Action: ActionIsolate,
				Entry: Entry{PodUID: "uid-p", Namespace: "ns", Pod: "p", Container: "c", ContainerID: "id",
					Shared: &api.SharedGPU{GPU: api.GPURef{UUID: uuid3, Index: 3}, MemoryMiB: 4096, Cores: 20}},
				PlacedLocally: true,
				Adjustment: Adjustment{
					AddDeviceNodes: gpuNodes(13),
					CgroupRules:    gpuRules(13),
					Env:            sharedEnv(uuid3, "3", "4096", "20"),
					Mounts:         mpsMount(uuid3),
					CPUSetCPUs:     "8-15", CPUSetMems: "1",
				},
			},
		},
		{
			name: "the container's own earlier entry (a restart) does not count against it",
			node: func(n *Node) {
				n.Ledger = []Entry{{PodUID: "uid-p", Namespace: "ns", Pod: "p", Container: "c", ContainerID: "old", GPUs: []api.GPURef{{UUID: uuid1, Index: 1}}}}
			},
			req: Request{Pod: pod(nil), Container: Container{ID: "new", Name: "c", ExclusiveCPUs: true}, Devices: Devices{Whole: []string{uuid1}}},
			want: &Decision{
				Action: ActionIsolate,
				Entry:  Entry{PodUID: "uid-p", Namespace: "ns", Pod: "p", Container: "c", ContainerID: "new", GPUs: []api.GPURef{{UUID: uuid1, Index: 1}}},
				Adjustment: Adjustment{
					AddDeviceNodes: gpuNodes(11),
					CgroupRules:    gpuRules(11),
					Env: []EnvVar{
						{api.EnvNVIDIAVisibleDevices, uuid1}, {api.EnvGPUUUIDs, uuid1}, {api.EnvGPUIndices, "1"}, {api.EnvGPUShared, "false"},
					},
				},
			},
		},

		{
			name: "a whole GPU of an init container of the same pod is reused",
			node: func(n *Node) {
				n.Ledger = []Entry{{PodUID: "uid-p", Namespace: "ns", Pod: "p", Container: "init", ContainerID: "init", GPUs: []api.GPURef{{UUID: uuid1, Index: 1}}}}
			},
			req: Request{Pod: pod(nil), Container: Container{ID: "app", Name: "c", ExclusiveCPUs: true}, Devices: Devices{Whole: []string{uuid1}}},
			want: &Decision{
				Action: ActionIsolate,
				Entry:  Entry{PodUID: "uid-p", Namespace: "ns", Pod: "p", Container: "c", ContainerID: "app", GPUs: []api.GPURef{{UUID: uuid1, Index: 1}}},
				Adjustment: Adjustment{
					AddDeviceNodes: gpuNodes(11),
					CgroupRules:    gpuRules(11),
					Env: []EnvVar{
						{api.EnvNVIDIAVisibleDevices, uuid1}, {api.EnvGPUUUIDs, uuid1}, {api.EnvGPUIndices, "1"}, {api.EnvGPUShared, "false"},
					},
				},
			},
		},

		// Refusals.
		{
			name:    "whole GPU unknown on this node",
			req:     Request{Pod: pod(nil), Container: Container{Name: "c"}, Devices: Devices{Whole: []string{uuidX}}},
			wantErr: `container "c" of pod ns/p: GPU ` + uuidX + `: the kubelet allocated it but it is not a GPU of this node`,
		},
		{
			name:    "shared GPU of the assignment unknown on this node",
			req:     Request{Pod: pod(annotate(t, sharedOn(uuidX, 7, 1024, 10))), Container: Container{Name: "c"}, Devices: Devices{MemoryUnits: 1, CoreUnits: 10}},
			wantErr: `container "c" of pod ns/p: GPU ` + uuidX + `: assigned by the annotation but not a GPU of this node`,
		},
		{
			name:    "shared GPU unhealthy",
			node:    func(n *Node) { n.Unhealthy = map[string]string{uuid1: "XID 79"} },
			req:     Request{Pod: pod(annotate(t, sharedOn(uuid1, 1, 1024, 10))), Container: Container{Name: "c"}, Devices: Devices{MemoryUnits: 1, CoreUnits: 10}},
			wantErr: `container "c" of pod ns/p: GPU ` + uuid1 + `: unhealthy: XID 79`,
		},
		{
			name:    "whole GPU unhealthy",
			node:    func(n *Node) { n.Unhealthy = map[string]string{uuid2: "lost"} },
			req:     Request{Pod: pod(nil), Container: Container{Name: "c"}, Devices: Devices{Whole: []string{uuid2}}},
			wantErr: `GPU ` + uuid2 + `: unhealthy: lost`,
		},
		{
			name: "shared memory over-committed",
			node: func(n *Node) {
				n.Ledger = []Entry{other("a", &api.SharedGPU{GPU: api.GPURef{UUID: uuid1, Index: 1}, MemoryMiB: 12288, Cores: 10})}
			},
			req:     Request{Pod: pod(annotate(t, sharedOn(uuid1, 1, 4096, 10))), Container: Container{Name: "c"}, Devices: Devices{MemoryUnits: 4, CoreUnits: 10}},
			wantErr: `GPU ` + uuid1 + `: over-committed: 12288 MiB of its 15360 shared MiB are in use by 1 container(s) and the container asks for 4096 MiB`,
		},
		{
			name: "shared cores over-committed",
			node: func(n *Node) {
				n.Ledger = []Entry{
					other("a", &api.SharedGPU{GPU: api.GPURef{UUID: uuid1, Index: 1}, MemoryMiB: 1024, Cores: 60}),
					other("b", &api.SharedGPU{GPU: api.GPURef{UUID: uuid1, Index: 1}, MemoryMiB: 1024, Cores: 30}),
				}
			},
			req:     Request{Pod: pod(annotate(t, sharedOn(uuid1, 1, 1024, 20))), Container: Container{Name: "c"}, Devices: Devices{MemoryUnits: 1, CoreUnits: 20}},
			wantErr: `GPU ` + uuid1 + `: over-committed: 90% of its compute is in use by 2 container(s) and the container asks for 20%`,
		},
		{
			name:    "whole GPU already allocated to another container",
			node:    func(n *Node) { n.Ledger = []Entry{other("a", nil, api.GPURef{UUID: uuid1, Index: 1})} },
			req:     Request{Pod: pod(nil), Container: Container{Name: "c"}, Devices: Devices{Whole: []string{uuid1}}},
			wantErr: `GPU ` + uuid1 + `: already allocated whole to ns/a container c`,
		},
		{
			name: "whole GPU serving shared containers",
			node: func(n *Node) {
				n.Ledger = []Entry{other("a", &api.SharedGPU{GPU: api.GPURef{UUID: uuid1, Index: 1}, MemoryMiB: 1024})}
			},
			req:     Request{Pod: pod(nil), Container: Container{Name: "c"}, Devices: Devices{Whole: []string{uuid1}}},
			wantErr: `GPU ` + uuid1 + `: serves 1 shared container(s) (ns/a container c) and cannot also be used whole`,
		},
		{
			name:    "shared GPU allocated whole to another container",
			node:    func(n *Node) { n.Ledger = []Entry{other("a", nil, api.GPURef{UUID: uuid1, Index: 1})} },
			req:     Request{Pod: pod(annotate(t, sharedOn(uuid1, 1, 1024, 10))), Container: Container{Name: "c"}, Devices: Devices{MemoryUnits: 1, CoreUnits: 10}},
			wantErr: `GPU ` + uuid1 + `: allocated whole to ns/a container c and cannot serve shared units`,
		},
		{
			name: "device plugin env names other GPUs than the kubelet allocated",
			req: Request{Pod: pod(nil), Container: Container{Name: "c", Env: map[string]string{api.EnvNVIDIAVisibleDevices: uuid0}},
				Devices: Devices{Whole: []string{uuid1}}},
			wantErr: `NVIDIA_VISIBLE_DEVICES=` + uuid0 + ` from the device plugin does not match the container's GPUs [` + uuid1 + `]`,
		},
		{
			name: "CDI device of a GPU the container was not allocated",
			req: Request{Pod: pod(nil), Container: Container{Name: "c", CDIDevices: []string{"nvidia.com/gpu=" + uuid3}},
				Devices: Devices{Whole: []string{uuid1}}},
			wantErr: `CDI device nvidia.com/gpu=` + uuid3 + ` is GPU ` + uuid3 + `, which is not one of the container's GPUs [` + uuid1 + `]`,
		},
		{
			name: "volume-mounts device list names a GPU the container was not allocated",
			req: Request{Pod: pod(nil), Container: Container{Name: "c",
				Env:               map[string]string{api.EnvNVIDIAVisibleDevices: api.NVIDIAVolumeMountsDir},
				MountDestinations: []string{"/data", api.NVIDIAVolumeMountsDir + "/" + uuid1, api.NVIDIAVolumeMountsDir + "/" + uuid2}},
				Devices: Devices{Whole: []string{uuid1}}},
			wantErr: `the device list mount ` + api.NVIDIAVolumeMountsDir + "/" + uuid2 + ` names GPU ` + uuid2 + `, which is not one of the container's GPUs [` + uuid1 + `]`,
		},
		{
			name: "assignment and kubelet disagree on whole GPUs",
			req: Request{Pod: pod(annotate(t, api.ContainerAssignment{Name: "c", GPUs: []api.GPURef{{UUID: uuid0, Index: 0}}})),
				Container: Container{Name: "c"}, Devices: Devices{Whole: []string{uuid1}}},
			wantErr: `the assignment annotation and the kubelet disagree on the container's whole GPUs: annotation [` + uuid0 + `], kubelet [` + uuid1 + `]`,
		},
		{
			name:    "assignment gives more memory than the kubelet allocated",
			req:     Request{Pod: pod(annotate(t, sharedOn(uuid1, 1, 4096, 10))), Container: Container{Name: "c"}, Devices: Devices{MemoryUnits: 2, CoreUnits: 10}},
			wantErr: `GPU ` + uuid1 + `: the assignment gives 4096 MiB of GPU memory but the kubelet allocated only 2 tessera.dev/gpu-memory units (2048 MiB)`,
		},
		{
			name:    "assignment index differs from the node's",
			req:     Request{Pod: pod(annotate(t, sharedOn(uuid1, 3, 1024, 10))), Container: Container{Name: "c"}, Devices: Devices{MemoryUnits: 1, CoreUnits: 10}},
			wantErr: `GPU ` + uuid1 + `: the assignment says index 3 but it is GPU 1 on this node`,
		},
		{
			name:     "whole and shared in one container",
			req:      Request{Pod: pod(nil), Container: Container{Name: "c"}, Devices: Devices{Whole: []string{uuid0}, MemoryUnits: 1}},
			wantErr:  `holds whole GPUs (tessera.dev/gpu) and shared units`,
			wantCode: gpureq.CodeWholeAndShared,
		},
		{
			name:     "core-only assignment gives more memory than cores% of the slice base",
			req:      Request{Pod: pod(annotate(t, sharedOn(uuid1, 1, 2048, 10))), Container: Container{Name: "c"}, Devices: Devices{CoreUnits: 10}},
			wantErr:  `GPU ` + uuid1 + `: the assignment gives 2048 MiB of GPU memory but the container's 10 tessera.dev/gpu-core units without tessera.dev/gpu-memory entitle it to 1536 MiB`,
			wantCode: gpureq.CodeAssignmentDisagrees,
		},
		{
			name:     "more than one GPU's cores",
			req:      Request{Pod: pod(nil), Container: Container{Name: "c"}, Devices: Devices{MemoryUnits: 1, CoreUnits: 101}},
			wantErr:  `container "c" of pod ns/p: the container holds 101 tessera.dev/gpu-core units, more than one GPU's 100`,
			wantCode: gpureq.CodeCoresAboveGPU,
		},
		{
			name:     "bypassed the extender with a slice larger than any GPU",
			req:      Request{Pod: pod(nil), Container: Container{Name: "c"}, Devices: Devices{MemoryUnits: 16, CoreUnits: 10}},
			wantErr:  `the container's slice of 16384 MiB is more than any GPU of this node shares (15360 MiB)`,
			wantCode: gpureq.CodeSliceTooLarge,
		},
		{
			name: "shared capacity is floored to whole memory units",
			opts: func(o *Options) { o.MemoryReserveMiB = 1000 }, // 16384-1000 MiB: 15 units, 15360 MiB
			node: func(n *Node) {
				n.Ledger = []Entry{other("a", &api.SharedGPU{GPU: api.GPURef{UUID: uuid1, Index: 1}, MemoryMiB: 14336})}
			},
			req:      Request{Pod: pod(annotate(t, sharedOn(uuid1, 1, 1030, 10))), Container: Container{Name: "c"}, Devices: Devices{MemoryUnits: 2, CoreUnits: 10}},
			wantErr:  `GPU ` + uuid1 + `: over-committed: 14336 MiB of its 15360 shared MiB are in use by 1 container(s) and the container asks for 1030 MiB`,
			wantCode: gpureq.CodeMemoryOvercommitted,
		},
		{
			name:    "malformed assignment annotation",
			req:     Request{Pod: pod(map[string]string{api.AnnotationAssignment: "{"}), Container: Container{Name: "c"}, Devices: Devices{MemoryUnits: 1}},
			wantErr: `container "c" of pod ns/p: annotation tessera.dev/assignment: not valid JSON`,
		},
		{
			name: "bypassed the extender and no GPU has room",
			node: func(n *Node) {
				for i, g := range n.GPUs {
					n.Ledger = append(n.Ledger, other(string(rune('a'+i)), &api.SharedGPU{GPU: api.GPURef{UUID: g.UUID, Index: g.Index}, MemoryMiB: 15360}))
				}
			},
			req:     Request{Pod: pod(nil), Container: Container{Name: "c"}, Devices: Devices{MemoryUnits: 1}},
			wantErr: `the pod carries no assignment for the container's shared units and none of this node's GPUs can take them`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := testOptions(t)
			if tc.opts != nil {
				tc.opts(&opts)
			}
			node := testNode()
			if tc.node != nil {
				tc.node(node)
			}
			got, err := Decide(opts, node, tc.req)
			if tc.wantErr != "" {
				var de *DecisionError
				if !errors.As(err, &de) {
					t.Fatalf("Decide = %+v, %v; want a *DecisionError containing %q", got, err, tc.wantErr)
				}
				if !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %q\ndoes not contain %q", err, tc.wantErr)
				}
				if tc.wantCode != "" && de.Code != tc.wantCode {
					t.Errorf("error code %q, want %q", de.Code, tc.wantCode)
				}
				if got != nil {
					t.Errorf("Decide returned a decision with its error: %+v", got)
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

// voidRules are the device cgroup rules every container without a Tessera
// GPU gets (UVM major 510), then deny rules for each extra node.
func voidRules(extra ...CgroupRule) []CgroupRule {
	return append([]CgroupRule{
		{Allow: false, Type: "c", Major: i64(195), Access: "rwm"},
		{Allow: false, Type: "c", Major: i64(510), Access: "rwm"},
	}, extra...)
}

func voidEnv() []EnvVar { return []EnvVar{{api.EnvNVIDIAVisibleDevices, "void"}} }

func TestDecideNonGPU(t *testing.T) {
	gpuPod := pod(annotate(t, api.ContainerAssignment{Name: "train", GPUs: []api.GPURef{{UUID: uuid1, Index: 1}}}))
	for _, tc := range []struct {
		name string
		opts func(*Options)
		pod  Pod
		ctr  Container
		want *Decision
	}{
		{
			name: "env all",
			ctr:  Container{Name: "c", Env: map[string]string{api.EnvNVIDIAVisibleDevices: "all"}},
			want: &Decision{Action: ActionVoid, Adjustment: Adjustment{CgroupRules: voidRules(), Env: voidEnv()},
				Voided: []string{"NVIDIA_VISIBLE_DEVICES=all"}},
		},
		{
			name: "env none (driver without GPUs)",
			ctr:  Container{Name: "c", Env: map[string]string{api.EnvNVIDIAVisibleDevices: "none"}},
			want: &Decision{Action: ActionVoid, Adjustment: Adjustment{CgroupRules: voidRules(), Env: voidEnv()},
				Voided: []string{"NVIDIA_VISIBLE_DEVICES=none"}},
		},
		{
			name: "env unset: a legacy CUDA image would mean all",
			ctr:  Container{Name: "c", Env: map[string]string{"CUDA_VERSION": "8.0"}},
			want: &Decision{Action: ActionVoid, Adjustment: Adjustment{CgroupRules: voidRules(), Env: voidEnv()}},
		},
		{
			name: "env already void",
			ctr:  Container{Name: "c", Env: map[string]string{api.EnvNVIDIAVisibleDevices: "void"}},
			want: &Decision{Action: ActionVoid, Adjustment: Adjustment{CgroupRules: voidRules(), Env: voidEnv()}},
		},
		{
			name: "env UUID list",
			ctr:  Container{Name: "c", Env: map[string]string{api.EnvNVIDIAVisibleDevices: uuid0 + "," + uuid3}},
			want: &Decision{Action: ActionVoid, Adjustment: Adjustment{CgroupRules: voidRules(), Env: voidEnv()},
				Voided: []string{"NVIDIA_VISIBLE_DEVICES=" + uuid0 + "," + uuid3}},
		},
		{
			name: "other NVIDIA request variables are unset, CUDA's are kept",
			ctr: Container{Name: "c", Env: map[string]string{
				"NVIDIA_MIG_CONFIG_DEVICES": "all", "NVIDIA_MIG_MONITOR_DEVICES": "all", "NVIDIA_IMEX_CHANNELS": "0",
				"DOCKER_RESOURCE_GPU": uuid1, "CUDA_VISIBLE_DEVICES": "0", "NVIDIA_DRIVER_CAPABILITIES": "all",
			}},
			want: &Decision{Action: ActionVoid,
				Adjustment: Adjustment{CgroupRules: voidRules(), Env: append(voidEnv(),
					EnvVar{"DOCKER_RESOURCE_GPU", ""}, EnvVar{"NVIDIA_IMEX_CHANNELS", ""}, EnvVar{"NVIDIA_MIG_CONFIG_DEVICES", ""}, EnvVar{"NVIDIA_MIG_MONITOR_DEVICES", ""})},
				Voided: []string{"DOCKER_RESOURCE_GPU=" + uuid1, "NVIDIA_IMEX_CHANNELS=0", "NVIDIA_MIG_CONFIG_DEVICES=all", "NVIDIA_MIG_MONITOR_DEVICES=all"}},
		},
		{
			name: "device nodes of the driver are removed and denied, others kept",
			ctr: Container{Name: "c", DeviceNodes: []DeviceNode{
				{Path: "/dev/nvidia12", Type: "c", Major: 195, Minor: 12},
				{Path: "/dev/null", Type: "c", Major: 1, Minor: 3},
				{Path: "/dev/nvidia-uvm", Type: "c", Major: 510, Minor: 0},
				{Path: "/dev/nvidiactl", Type: "c", Major: 195, Minor: 255},
				{Path: "/dev/nvidia-caps/nvidia-cap1", Type: "c", Major: 237, Minor: 1},
				{Path: "/dev/gpu0", Type: "c", Major: 195, Minor: 10}, // renamed by the spec
				{Path: "/dev/fuse", Type: "c", Major: 10, Minor: 229},
			}},
			want: &Decision{Action: ActionVoid,
				Adjustment: Adjustment{
					RemoveDeviceNodes: []string{"/dev/gpu0", "/dev/nvidia-caps/nvidia-cap1", "/dev/nvidia-uvm", "/dev/nvidia12", "/dev/nvidiactl"},
					CgroupRules:       voidRules(CgroupRule{Allow: false, Type: "c", Major: i64(237), Minor: i64(1), Access: "rwm"}),
					Env:               voidEnv(),
				},
				Voided: []string{"device /dev/gpu0 (c 195:10)", "device /dev/nvidia-caps/nvidia-cap1 (c 237:1)", "device /dev/nvidia-uvm (c 510:0)", "device /dev/nvidia12 (c 195:12)", "device /dev/nvidiactl (c 195:255)"}},
		},
		{
			name: "UVM major unknown: its nodes are removed by path and denied one by one",
			opts: func(o *Options) { o.UVMMajor = -1 },
			ctr: Container{Name: "c", DeviceNodes: []DeviceNode{
				{Path: "/dev/nvidia-uvm-tools", Type: "c", Major: 511, Minor: 1},
				{Path: "/dev/nvidia-uvm", Type: "c", Major: 511, Minor: 0},
			}},
			want: &Decision{Action: ActionVoid,
				Adjustment: Adjustment{
					RemoveDeviceNodes: []string{"/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"},
					CgroupRules: []CgroupRule{
						{Allow: false, Type: "c", Major: i64(195), Access: "rwm"},
						{Allow: false, Type: "c", Major: i64(511), Minor: i64(0), Access: "rwm"},
						{Allow: false, Type: "c", Major: i64(511), Minor: i64(1), Access: "rwm"},
					},
					Env: voidEnv(),
				},
				Voided: []string{"device /dev/nvidia-uvm (c 511:0)", "device /dev/nvidia-uvm-tools (c 511:1)"}},
		},
		{
			name: "device list volume mounts (GPUs, IMEX channels) are removed",
			ctr:  Container{Name: "c", MountDestinations: []string{"/data", api.NVIDIAVolumeMountsDir + "/" + uuid1, api.NVIDIAVolumeMountsDir + "/imex/0", "/var/run/nvidia-container-devices-not"}},
			want: &Decision{Action: ActionVoid,
				Adjustment: Adjustment{CgroupRules: voidRules(), Env: voidEnv(),
					RemoveMounts: []string{api.NVIDIAVolumeMountsDir + "/" + uuid1, api.NVIDIAVolumeMountsDir + "/imex/0"}},
				Voided: []string{"mount " + api.NVIDIAVolumeMountsDir + "/" + uuid1, "mount " + api.NVIDIAVolumeMountsDir + "/imex/0"}},
		},
		{
			name: "GPUs of cdi.k8s.io annotations are withdrawn, other devices kept",
			ctr: Container{Name: "c", Annotations: map[string]string{
				"cdi.k8s.io/gpu":     "nvidia.com/gpu=all",
				"cdi.k8s.io/mixed":   "vendor.com/nic=0, nvidia.com/gpu=" + uuid1,
				"cdi.k8s.io/nic":     "vendor.com/nic=1",
				"example.com/devs":   "nvidia.com/gpu=0",
				"io.kubernetes.hash": "1",
			}},
			want: &Decision{Action: ActionVoid,
				Adjustment: Adjustment{CgroupRules: voidRules(), Env: voidEnv(),
					RemoveAnnotations: []string{"cdi.k8s.io/gpu"},
					SetAnnotations:    []Annotation{{Key: "cdi.k8s.io/mixed", Value: "vendor.com/nic=0"}}},
				Voided: []string{"annotation cdi.k8s.io/gpu=nvidia.com/gpu=all", "annotation cdi.k8s.io/mixed=vendor.com/nic=0, nvidia.com/gpu=" + uuid1}},
		},
		{
			name: "the configured CDI kind is the one withdrawn",
			opts: func(o *Options) { o.CDIKind = "example.com/gpu" },
			ctr:  Container{Name: "c", Annotations: map[string]string{"cdi.k8s.io/a": "nvidia.com/gpu=0", "cdi.k8s.io/b": "example.com/gpu=0"}},
			want: &Decision{Action: ActionVoid,
				Adjustment: Adjustment{CgroupRules: voidRules(), Env: voidEnv(), RemoveAnnotations: []string{"cdi.k8s.io/b"}},
				Voided:     []string{"annotation cdi.k8s.io/b=example.com/gpu=0"}},
		},
		{
			name: "CDI devices requested through the CRI: their device nodes go",
			ctr: Container{Name: "c", CDIDevices: []string{"nvidia.com/gpu=" + uuid1, "vendor.com/nic=0"},
				DeviceNodes: []DeviceNode{{Path: "/dev/nvidia11", Type: "c", Major: 195, Minor: 11}}},
			want: &Decision{Action: ActionVoid,
				Adjustment: Adjustment{CgroupRules: voidRules(), Env: voidEnv(), RemoveDeviceNodes: []string{"/dev/nvidia11"}},
				Voided:     []string{"device /dev/nvidia11 (c 195:11)", "CDI device nvidia.com/gpu=" + uuid1 + " (its device nodes are removed)"}},
		},
		{
			name: "a GPU pod's sidecar without GPU requests gets no GPU",
			pod:  gpuPod,
			ctr:  Container{Name: "sidecar", Env: map[string]string{api.EnvNVIDIAVisibleDevices: uuid1}},
			want: &Decision{Action: ActionVoid, Adjustment: Adjustment{CgroupRules: voidRules(), Env: voidEnv()},
				Voided: []string{"NVIDIA_VISIBLE_DEVICES=" + uuid1}},
		},
		{
			name: "configured to leave: left alone whatever the spec says",
			opts: func(o *Options) { o.NonGPU.Leave = true },
			ctr: Container{Name: "c", Env: map[string]string{api.EnvNVIDIAVisibleDevices: "all"},
				DeviceNodes: []DeviceNode{{Path: "/dev/nvidia0", Type: "c", Major: 195, Minor: 10}}},
			want: &Decision{Action: ActionLeave},
		},
		{
			name: "exempt namespace: left alone",
			opts: func(o *Options) { o.NonGPU.ExemptNamespaces = []string{"monitoring", "ns"} },
			ctr:  Container{Name: "c", Env: map[string]string{api.EnvNVIDIAVisibleDevices: "all"}},
			want: &Decision{Action: ActionLeave},
		},
		{
			name: "another namespace is exempt: void",
			opts: func(o *Options) { o.NonGPU.ExemptNamespaces = []string{"monitoring"} },
			ctr:  Container{Name: "c", Env: map[string]string{api.EnvNVIDIAVisibleDevices: "all"}},
			want: &Decision{Action: ActionVoid, Adjustment: Adjustment{CgroupRules: voidRules(), Env: voidEnv()},
				Voided: []string{"NVIDIA_VISIBLE_DEVICES=all"}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := testOptions(t)
			if tc.opts != nil {
				tc.opts(&opts)
			}
			p := tc.pod
			if p.UID == "" {
				p = pod(nil)
			}
			got, err := Decide(opts, testNode(), Request{Pod: p, Container: tc.ctr})
			if err != nil {
				t.Fatalf("Decide: %v", err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Decide (-want +got):\n%s", diff)
			}
		})
	}
}

func TestNonGPUFromConfig(t *testing.T) {
	c := api.NewNodeAgentConfig()
	if got := NonGPUFromConfig(c); got.Leave || len(got.ExemptNamespaces) != 0 {
		t.Errorf("default config: %+v, want void without exemptions", got)
	}
	c.NRI = api.NRIConfig{NonGPUContainers: api.NonGPUContainersLeave, NonGPUExemptNamespaces: []string{"monitoring"}}
	if diff := cmp.Diff(NonGPU{Leave: true, ExemptNamespaces: []string{"monitoring"}}, NonGPUFromConfig(c)); diff != "" {
		t.Errorf("NonGPUFromConfig (-want +got):\n%s", diff)
	}
}

func TestDecisionErrorNamesPodContainerGPU(t *testing.T) {
	err := &DecisionError{Pod: "ns/p", Container: "c", GPU: uuid1, Reason: "unhealthy: XID 79"}
	want := `tessera: refusing to create container "c" of pod ns/p: GPU ` + uuid1 + `: unhealthy: XID 79`
	if err.Error() != want {
		t.Errorf("Error() = %q, want %q", err.Error(), want)
	}
}

// BenchmarkDecide measures one shared-container decision on a node whose
// ledger holds 64 other containers (it runs on every CreateContainer, under
// the runtime's plugin request timeout).
func BenchmarkDecide(b *testing.B) {
	p, err := allocator.NewPolicy(allocator.PolicyBestFit)
	if err != nil {
		b.Fatal(err)
	}
	opts := Options{MemoryUnitMiB: 256, MemoryReserveMiB: 1024, UVMMajor: 510, CDIKind: api.DefaultCDIKind,
		MPSPipeDir: func(uuid string) string { return "/mps/" + uuid }, Policy: p}
	node := testNode()
	for i := 0; i < 64; i++ {
		g := node.GPUs[i%len(node.GPUs)]
		node.Ledger = append(node.Ledger, Entry{PodUID: "u" + strconv.Itoa(i), Namespace: "ns", Pod: "p" + strconv.Itoa(i), Container: "c",
			Shared: &api.SharedGPU{GPU: api.GPURef{UUID: g.UUID, Index: g.Index}, MemoryMiB: 256, Cores: 1}})
	}
	req := Request{Pod: Pod{Namespace: "ns", Name: "new", UID: "new"}, Container: Container{ID: "id", Name: "c"}, Devices: Devices{MemoryUnits: 2, CoreUnits: 5}}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Decide(opts, node, req); err != nil {
			b.Fatal(err)
		}
	}
}
