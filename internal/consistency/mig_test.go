package consistency_test

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/deviceplugin"
	"github.com/tessera-gpu/tessera/deviceplugin/devices"
	"github.com/tessera-gpu/tessera/extender"
	equota "github.com/tessera-gpu/tessera/extender/quota"
	"github.com/tessera-gpu/tessera/gpu"
	"github.com/tessera-gpu/tessera/gpu/nvmlmock"
	"github.com/tessera-gpu/tessera/gpureq"
	"github.com/tessera-gpu/tessera/nri"
	"github.com/tessera-gpu/tessera/topology"
)

// migFixture is the mock DGX A100 with MIG as every component sees it: the
// device model and inventory the node agent builds from its topology, the
// extender's view of that inventory, and the NRI plugin's GPUs.
type migFixture struct {
	m     *nvmlmock.Machine
	model *devices.Model
	info  *extender.NodeInfo
	nri   []nri.GPU
}

func newMIGFixture(t *testing.T) *migFixture {
	t.Helper()
	f := &migFixture{m: nvmlmock.DGXA100MIG()}
	lib := gpu.NewNVML(f.m.NVML())
	if err := lib.Init(); err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	if err := f.m.WriteSysfs(root); err != nil {
		t.Fatal(err)
	}
	topo, err := topology.Build(lib, topology.Sysfs{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	cfg := &api.NodeAgentConfig{MemoryUnitMiB: unitMiB, MemoryReserveMiB: reserveMiB}
	cfg.Default()
	var gpus []devices.GPU
	for _, g := range topo.GPUs {
		gpus = append(gpus, deviceplugin.ModelGPU(g))
	}
	served, _ := deviceplugin.ServedResources(cfg, gpus)
	if f.model, err = devices.New(gpus, devices.Options{Resources: served, MemoryUnitMiB: unitMiB, MemoryReserveMiB: reserveMiB}); err != nil {
		t.Fatal(err)
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Annotations: map[string]string{}},
		Status: corev1.NodeStatus{Allocatable: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("64"), corev1.ResourceMemory: resource.MustParse("512Gi")}}}
	if err := api.SetGPUInventory(node.Annotations, deviceplugin.BuildInventory(topo, f.model, cfg, nil, true)); err != nil {
		t.Fatal(err)
	}
	if f.info = extender.NewNodeInfo(node); f.info.Err != nil {
		t.Fatal(f.info.Err)
	}
	if f.nri, err = nri.GPUsFromTopology(topo, lib); err != nil {
		t.Fatal(err)
	}
	return f
}

// migCtr is one container of a MIG row: MIG instances per profile, and
// whole GPUs.
type migCtr struct {
	name  string
	mig   map[string]int64
	whole int64
}

func (r migRow) pod() *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: types.UID("uid-p")}}
	for _, c := range r.ctrs {
		list := corev1.ResourceList{}
		for profile, n := range c.mig {
			list[api.MIGResource(profile)] = *resource.NewQuantity(n, resource.DecimalSI)
		}
		if c.whole > 0 {
			list[api.ResourceGPU] = *resource.NewQuantity(c.whole, resource.DecimalSI)
		}
		p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: c.name, Resources: corev1.ResourceRequirements{Limits: list}})
	}
	return p
}

type migRow struct {
	name string
	ctrs []migCtr
	// want is the extender's verdict: a request-model code, or a
	// scheduling reason of the node (reason).
	want   gpureq.Code
	reason extender.Reason
	// nri is the NRI plugin's verdict on the containers the kubelet would
	// create (accept, or a code); skipNode: the kubelet never admits it.
	nri      gpureq.Code
	skipNode bool
}

// MIG requests through the extender's fit, quota, the device plugin's
// Allocate checks and the NRI decision: they agree, and a pod's MIG
// instances as the node agent records them count as used for the extender.
func TestMIGRequests(t *testing.T) {
	f := newMIGFixture(t)
	for _, r := range []migRow{
		{name: "one 1g.5gb", ctrs: []migCtr{{name: "main", mig: map[string]int64{"1g.5gb": 1}}}},
		{name: "all 16 1g.5gb", ctrs: []migCtr{{name: "main", mig: map[string]int64{"1g.5gb": 16}}}},
		{name: "two profiles in two containers", ctrs: []migCtr{{name: "a", mig: map[string]int64{"3g.20gb": 2}}, {name: "b", mig: map[string]int64{"2g.10gb": 1, "1g.5gb": 3}}}},
		{name: "more 3g.20gb than the node has", ctrs: []migCtr{{name: "main", mig: map[string]int64{"3g.20gb": 3}}}, reason: extender.NoMIGProfile, skipNode: true},
		{name: "a profile the node lacks", ctrs: []migCtr{{name: "main", mig: map[string]int64{"7g.40gb": 1}}}, reason: extender.NoMIGProfile, skipNode: true},
		{name: "MIG and whole GPUs in one container", ctrs: []migCtr{{name: "main", mig: map[string]int64{"1g.5gb": 1}, whole: 1}}, want: gpureq.CodeMIGAndOther, nri: gpureq.CodeMIGAndOther},
		// The NRI plugin sees one container at a time: each alone is sound.
		{name: "MIG and whole GPUs in two containers", ctrs: []migCtr{{name: "a", mig: map[string]int64{"1g.5gb": 1}}, {name: "b", whole: 1}}, want: gpureq.CodeMIGAndOther},
	} {
		t.Run(r.name, func(t *testing.T) {
			pod := r.pod()

			// The extender.
			var ext gpureq.Code
			var reason extender.Reason
			d, err := extender.ParseDemand(pod)
			if err != nil {
				if !errors.Is(err, extender.ErrInvalidDemand) {
					t.Fatalf("ParseDemand: %v", err)
				}
				ext = codeOf(t, "ParseDemand", err)
			} else {
				reason = extender.Filter(extender.BuildNodeState(f.info, nil), &d).Reason
			}
			if ext != r.want || (ext == accept && reason != r.reason) {
				t.Fatalf("extender: code %q reason %q, want %q %q", ext, reason, r.want, r.reason)
			}

			// Quota: one count, each profile its resource.
			qu, err := gpureq.QuotaUse(pod)
			if got := codeOf(t, "QuotaUse", err); got != r.want {
				t.Errorf("quota: %q, want %q", got, r.want)
			}
			if diff := cmp.Diff(equota.Use(pod), qu); diff != "" {
				t.Errorf("quota.Use and gpureq.QuotaUse differ (-extender +gpureq):\n%s", diff)
			}
			if r.want == accept {
				for _, c := range r.ctrs {
					for profile, n := range c.mig {
						if got := qu[api.MIGResource(profile)]; got < n {
							t.Errorf("quota counts %d %s, the container asks %d", got, api.MIGResource(profile), n)
						}
					}
				}
			}
			if r.skipNode {
				return
			}

			// The kubelet allocates each container's instances (the
			// agent's preferred choice); Allocate and the NRI plugin see
			// them, with the assignment the agent records.
			node := &nri.Node{GPUs: f.nri}
			a := api.NewAssignment()
			var reqs []nri.Request
			taken := map[string]bool{}
			for i, c := range r.ctrs {
				req := nri.Request{Container: nri.Container{ID: fmt.Sprint("id-", i), Name: c.name}}
				var refs []api.MIGRef
				for _, profile := range sortedKeys(c.mig) {
					res := api.MIGResource(profile)
					var free []string
					for _, dev := range f.model.Devices(res, nil, devices.Usage{}) {
						if !taken[dev.ID] {
							free = append(free, dev.ID)
						}
					}
					ids := free[:c.mig[profile]]
					allocs, err := f.model.CheckMIG(res, ids, nil)
					if err != nil {
						t.Fatalf("Allocate %s: %v", res, err)
					}
					for _, al := range allocs {
						taken[al.Instance.UUID] = true
						req.Devices.MIG = append(req.Devices.MIG, nri.MIGDevice{UUID: al.Instance.UUID, Profile: profile})
						refs = append(refs, api.MIGRef{UUID: al.Instance.UUID, Profile: profile, GPU: api.GPURef{UUID: al.GPU.UUID, Index: al.GPU.Index}})
					}
				}
				for k := range c.whole {
					req.Devices.Whole = append(req.Devices.Whole, f.m.UUID(4+int(k)))
				}
				slices.SortFunc(refs, func(x, y api.MIGRef) int { return x.GPU.Index - y.GPU.Index })
				if len(refs) > 0 {
					a.Containers = append(a.Containers, api.ContainerAssignment{Name: c.name, MIG: refs})
				}
				reqs = append(reqs, req)
			}
			podNRI := nri.Pod{Namespace: "ns", Name: "p", UID: "uid-p", Annotations: map[string]string{}}
			if len(a.Containers) > 0 {
				if err := api.SetAssignment(podNRI.Annotations, a); err != nil {
					t.Fatal(err)
				}
			}
			nriCode := accept
			for _, req := range reqs {
				req.Pod = podNRI
				dec, err := nri.Decide(nri.Options{MemoryUnitMiB: unitMiB, MemoryReserveMiB: reserveMiB, UVMMajor: -1}, node, req)
				if err != nil {
					nriCode = codeOf(t, "nri.Decide", err)
					break
				}
				if len(dec.Entry.MIG) != len(req.Devices.MIG) {
					t.Errorf("NRI recorded %v for %v", dec.Entry.MIG, req.Devices.MIG)
				}
				node.Ledger = append(node.Ledger, dec.Entry)
			}
			if nriCode != r.nri {
				t.Fatalf("NRI: %q, want %q", nriCode, r.nri)
			}
			if r.want != accept {
				return
			}

			// Bound with the assignment the agent records, the pod's
			// instances are used for the extender: the same pod again fits
			// only where instances remain.
			bound := pod.DeepCopy()
			bound.Spec.NodeName = "n"
			bound.Annotations = map[string]string{}
			if err := api.SetAssignment(bound.Annotations, a); err != nil {
				t.Fatal(err)
			}
			st := extender.BuildNodeState(f.info, []*extender.PodUse{extender.NewPodUse(bound)})
			again := pod.DeepCopy()
			again.UID = "uid-again"
			d2, _ := extender.ParseDemand(again)
			fits := extender.Filter(st, &d2).Fits()
			room := true
			for _, c := range r.ctrs {
				for profile, n := range c.mig {
					total := len(f.model.Devices(api.MIGResource(profile), nil, devices.Usage{}))
					room = room && int64(total) >= 2*n
				}
			}
			if fits != room {
				t.Errorf("the same pod again beside the bound one: fits %v, want %v", fits, room)
			}
		})
	}
}

func sortedKeys(m map[string]int64) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
