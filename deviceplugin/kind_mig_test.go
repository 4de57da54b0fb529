package deviceplugin

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/deviceplugin/devices"
)

func migID(gpu, start int) string { return fmt.Sprintf("MIG-%08d-0000-0000-0000-%012d", gpu, start) }

var (
	mig1g = api.MIGResource("1g.5gb")
	mig3g = api.MIGResource("3g.20gb")
)

// migTestGPUs: GPUs 0-1 in 7 x 1g.5gb, GPU 2 in 3g.20gb + 2g.10gb +
// 1g.5gb, GPU 3 whole.
func migTestGPUs() []devices.GPU {
	var gpus []devices.GPU
	for i := 0; i < 4; i++ {
		gpus = append(gpus, devices.GPU{Index: i, UUID: fmt.Sprintf("GPU-%d", i), NUMANode: i / 2, MemoryMiB: 40960})
	}
	for _, i := range []int{0, 1} {
		gpus[i].MIGMode = true
		for s := 0; s < 7; s++ {
			gpus[i].MIG = append(gpus[i].MIG, devices.MIGInstance{UUID: migID(i, s), Profile: "1g.5gb", Start: s, Size: 1})
		}
	}
	gpus[2].MIGMode = true
	gpus[2].MIG = []devices.MIGInstance{
		{UUID: migID(2, 0), Profile: "3g.20gb", Start: 0, Size: 4},
		{UUID: migID(2, 4), Profile: "2g.10gb", Start: 4, Size: 2},
		{UUID: migID(2, 6), Profile: "1g.5gb", Start: 6, Size: 1},
	}
	return gpus
}

func migTestKinds(t *testing.T, mutate func(*api.NodeAgentConfig)) (*devices.Model, map[corev1.ResourceName]Kind) {
	t.Helper()
	cfg := api.NewNodeAgentConfig()
	if mutate != nil {
		mutate(cfg)
	}
	gpus := migTestGPUs()
	resources, _ := ServedResources(cfg, gpus)
	m, err := devices.New(gpus, devices.Options{Resources: resources, MemoryUnitMiB: cfg.MemoryUnitMiB})
	if err != nil {
		t.Fatal(err)
	}
	kinds, err := newKinds(kindEnv{cfg: cfg, resources: resources, model: m})
	if err != nil {
		t.Fatal(err)
	}
	out := map[corev1.ResourceName]Kind{}
	for _, k := range kinds {
		out[k.Resource()] = k
	}
	return m, out
}

func TestServedResources(t *testing.T) {
	gpus := migTestGPUs()
	mig2g := api.MIGResource("2g.10gb")
	tests := []struct {
		name       string
		resources  []corev1.ResourceName
		gpus       []devices.GPU
		want       []corev1.ResourceName
		wantAbsent []corev1.ResourceName
	}{
		{name: "default: every profile present", want: append(api.Resources(), mig1g, mig2g, mig3g)},
		{name: "no GPU in MIG mode", gpus: migTestGPUs()[3:], want: api.Resources()},
		{name: "whole only, MIG by default", resources: []corev1.ResourceName{api.ResourceGPU}, want: []corev1.ResourceName{api.ResourceGPU, mig1g, mig2g, mig3g}},
		{name: "listed MIG resources only", resources: []corev1.ResourceName{api.ResourceGPU, mig3g, api.MIGResource("1g.10gb")}, want: []corev1.ResourceName{api.ResourceGPU, mig3g}, wantAbsent: []corev1.ResourceName{api.MIGResource("1g.10gb")}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := &api.NodeAgentConfig{Resources: tc.resources}
			cfg.Default()
			g := gpus
			if tc.gpus != nil {
				g = tc.gpus
			}
			got, absent := ServedResources(cfg, g)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("served (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantAbsent, absent); diff != "" {
				t.Errorf("absent (-want +got):\n%s", diff)
			}
		})
	}
}

func TestMIGKind(t *testing.T) {
	m, kinds := migTestKinds(t, nil)
	k := kinds[mig1g]
	if k == nil {
		t.Fatalf("no %s kind among %v", mig1g, kinds)
	}
	if _, ok := k.(PreferredAllocator); !ok {
		t.Error("the MIG kind has no preferred allocation")
	}
	for _, trait := range []bool{isA[Withholder](k), isA[SharedKind](k), isA[AssignedReader](k)} {
		if trait {
			t.Errorf("the MIG kind is a withholder, shared or assigned reader")
		}
	}
	// 15 instances of 1g.5gb, each on its GPU's NUMA node; an XID on GPU 2
	// takes out its instance only.
	list := kindDevices(k, devices.HealthMap{"GPU-2": {Reason: "XID 79"}}, devices.Usage{Whole: map[string]bool{"GPU-0": true}})
	var got []string
	for _, d := range list {
		got = append(got, fmt.Sprintf("%s %d %v %s", d.ID, d.NUMANode, d.Healthy, d.Reason))
	}
	var want []string
	for _, i := range []int{0, 1} {
		for s := 0; s < 7; s++ {
			want = append(want, fmt.Sprintf("%s 0 true ", migID(i, s)))
		}
	}
	want = append(want, fmt.Sprintf("%s 1 false XID 79", migID(2, 6)))
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("devices (-want +got):\n%s", diff)
	}
	if !slices.Equal(kindDevices(k, nil, devices.Usage{}), m.Devices(mig1g, nil, devices.Usage{})) {
		t.Error("the kind's devices differ from the model's")
	}
	// The whole kind offers only GPU 3.
	var whole []string
	for _, d := range kinds[api.ResourceGPU].Devices() {
		whole = append(whole, d.ID)
	}
	if diff := cmp.Diff([]string{"GPU-3"}, whole); diff != "" {
		t.Errorf("whole GPUs (-want +got):\n%s", diff)
	}
}

func isA[T any](k Kind) bool { _, ok := k.(T); return ok }

func TestMIGAllocate(t *testing.T) {
	tests := []struct {
		name       string
		strategy   []string
		cdiName    string
		containers [][]string
		health     devices.HealthMap
		want       []*pluginapi.ContainerAllocateResponse
		wantErr    string
	}{
		{
			name:       "cdi-cri",
			containers: [][]string{{migID(1, 3), migID(0, 5)}},
			want: []*pluginapi.ContainerAllocateResponse{{
				Envs:       map[string]string{"NVIDIA_VISIBLE_DEVICES": "void"},
				CdiDevices: []*pluginapi.CDIDevice{{Name: "nvidia.com/gpu=" + migID(0, 5)}, {Name: "nvidia.com/gpu=" + migID(1, 3)}},
			}},
		},
		{
			name:       "cdi-cri names MIG devices by UUID even with cdiDeviceName index",
			cdiName:    api.CDINameIndex,
			containers: [][]string{{migID(2, 6)}},
			want: []*pluginapi.ContainerAllocateResponse{{
				Envs:       map[string]string{"NVIDIA_VISIBLE_DEVICES": "void"},
				CdiDevices: []*pluginapi.CDIDevice{{Name: "nvidia.com/gpu=" + migID(2, 6)}},
			}},
		},
		{
			name:       "envvar, two containers",
			strategy:   []string{api.DeviceListEnvvar},
			containers: [][]string{{migID(0, 0)}, {migID(1, 0), migID(1, 1)}},
			want: []*pluginapi.ContainerAllocateResponse{
				{Envs: map[string]string{"NVIDIA_VISIBLE_DEVICES": migID(0, 0)}},
				{Envs: map[string]string{"NVIDIA_VISIBLE_DEVICES": migID(1, 0) + "," + migID(1, 1)}},
			},
		},
		{
			name:       "cdi-annotations",
			strategy:   []string{api.DeviceListCDIAnnotations},
			containers: [][]string{{migID(0, 0)}},
			want: []*pluginapi.ContainerAllocateResponse{{
				Envs:        map[string]string{"NVIDIA_VISIBLE_DEVICES": "void"},
				Annotations: map[string]string{api.CDIAnnotationPrefix + "tessera-node_mig-1g.5gb": "nvidia.com/gpu=" + migID(0, 0)},
			}},
		},
		{
			name:       "volume-mounts",
			strategy:   []string{api.DeviceListVolumeMounts},
			containers: [][]string{{migID(0, 0)}},
			want: []*pluginapi.ContainerAllocateResponse{{
				Envs:   map[string]string{"NVIDIA_VISIBLE_DEVICES": api.NVIDIAVolumeMountsDir},
				Mounts: []*pluginapi.Mount{{HostPath: "/dev/null", ContainerPath: api.NVIDIAVolumeMountsDir + "/" + migID(0, 0), ReadOnly: true}},
			}},
		},
		{name: "unhealthy GPU", containers: [][]string{{migID(1, 0)}}, health: devices.HealthMap{"GPU-1": {Reason: "XID 48"}}, wantErr: "unhealthy: XID 48"},
		{name: "two containers, one instance", containers: [][]string{{migID(0, 0)}, {migID(0, 0)}}, wantErr: "requested for two containers"},
		{name: "another profile's instance", containers: [][]string{{migID(2, 0)}}, wantErr: "is a 3g.20gb, not a 1g.5gb"},
		{name: "a whole GPU", containers: [][]string{{"GPU-3"}}, wantErr: "no such MIG instance"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, kinds := migTestKinds(t, func(c *api.NodeAgentConfig) {
				if tc.strategy != nil {
					c.DeviceListStrategy = tc.strategy
				}
				if tc.cdiName != "" {
					c.CDIDeviceName = tc.cdiName
				}
			})
			got, err := kinds[mig1g].Allocate(tc.containers, tc.health, devices.Usage{})
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Allocate = %v, want error containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got, cmp.Comparer(func(a, b *pluginapi.ContainerAllocateResponse) bool { return a.String() == b.String() })); diff != "" {
				t.Errorf("responses (-want +got):\n%s", diff)
			}
		})
	}
}

func TestMIGPreferred(t *testing.T) {
	_, kinds := migTestKinds(t, nil)
	k := kinds[mig1g].(PreferredAllocator)
	all := func() []string {
		var out []string
		for _, d := range k.Devices() {
			out = append(out, d.ID)
		}
		return out
	}
	without := func(ids []string, drop ...string) []string {
		return slices.DeleteFunc(slices.Clone(ids), func(s string) bool { return slices.Contains(drop, s) })
	}
	tests := []struct {
		name   string
		usable []string
		must   []string
		size   int
		inUse  []string
		want   []string
	}{
		// Nothing in use: one instance from GPU 2, whose lone 1g.5gb is
		// the tightest fit; two from one GPU, GPU 0.
		{name: "fresh node, one", usable: all(), size: 1, want: []string{migID(2, 6)}},
		{name: "fresh node, two on one GPU", usable: all(), size: 2, want: []string{migID(0, 0), migID(0, 1)}},
		// More than one GPU has: the fullest first, then the rest.
		{name: "more than a GPU has", usable: all(), size: 9, want: []string{migID(0, 0), migID(0, 1), migID(0, 2), migID(0, 3), migID(0, 4), migID(0, 5), migID(0, 6), migID(1, 0), migID(1, 1)}},
		// GPU 1 has instances in use: pack onto it, keep GPU 0 free.
		{name: "pack onto a GPU in use", usable: without(all(), migID(1, 0), migID(1, 1)), size: 2, inUse: []string{migID(1, 0), migID(1, 1)}, want: []string{migID(1, 2), migID(1, 3)}},
		// Any profile in use counts: GPU 2's 3g.20gb.
		{name: "another profile in use", usable: all(), size: 1, inUse: []string{migID(2, 0)}, want: []string{migID(2, 6)}},
		// A must-include instance counts as in use on its GPU: the rest
		// joins it.
		{name: "must include", usable: all(), must: []string{migID(1, 4)}, size: 3, want: []string{migID(1, 4), migID(1, 0), migID(1, 1)}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			u := devices.Usage{MIG: map[string]bool{}}
			for _, id := range tc.inUse {
				u.MIG[id] = true
			}
			got, err := k.Preferred(tc.usable, tc.must, tc.size, u)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Preferred (-want +got):\n%s", diff)
			}
		})
	}
	if _, err := k.Preferred([]string{migID(0, 0)}, nil, 2, devices.Usage{}); err == nil {
		t.Error("Preferred of 2 among 1 usable succeeded")
	}
}

func TestAgentResourcesIncludeMIG(t *testing.T) {
	cfg := api.NewNodeAgentConfig()
	gpus := migTestGPUs()
	served, _ := ServedResources(cfg, gpus)
	m, err := devices.New(gpus, devices.Options{Resources: served, MemoryUnitMiB: cfg.MemoryUnitMiB})
	if err != nil {
		t.Fatal(err)
	}
	a := &Agent{model: m}
	if diff := cmp.Diff(append(api.Resources(), mig1g, api.MIGResource("2g.10gb"), mig3g), a.Resources()); diff != "" {
		t.Errorf("Resources (-want +got):\n%s", diff)
	}
}
