package deviceplugin

import (
	"fmt"
	"slices"
	"sort"

	corev1 "k8s.io/api/core/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/deviceplugin/devices"
)

// migKind is tessera.dev/mig-<profile>: the MIG instances of that profile
// on the node's GPUs in MIG mode, one device per instance with its MIG UUID
// as ID and its GPU's NUMA node. Their health is their GPU's (an XID on
// the GPU takes all its instances out); nothing withholds them, since a
// GPU in MIG mode is never offered whole or as units. Preferred sets pack
// instances onto GPUs whose instances are already in use; the container
// gets its instances as deviceListStrategy says, like whole GPUs.
type migKind struct {
	resource corev1.ResourceName
	cfg      *api.NodeAgentConfig
	model    *devices.Model
	list     []devices.Device
}

var (
	_ Kind               = (*migKind)(nil)
	_ PreferredAllocator = (*migKind)(nil)
)

func newMIGKind(r corev1.ResourceName, env kindEnv) *migKind {
	return &migKind{resource: r, cfg: env.cfg, model: env.model, list: env.model.Devices(r, nil, devices.Usage{})}
}

func (k *migKind) Resource() corev1.ResourceName { return k.resource }

func (k *migKind) Devices() []devices.Device { return k.list }

func (k *migKind) Lookup(id string) (devices.GPU, error) { return k.model.Lookup(k.resource, id) }

// Preferred implements PreferredAllocator: mustInclude, then best fit by
// GPU: while devices are missing, the GPU that can give all that is missing
// if one can (else the one that gives most), among those the one with the
// most instances in use (of any profile, mustInclude counted), then the
// fewest usable instances of the profile, then the lowest index; its
// instances by placement. GPUs whose instances are all free stay free as
// long as possible, and a request lands on one GPU when one can take it.
func (k *migKind) Preferred(usable, mustInclude []string, size int, u devices.Usage) ([]string, error) {
	if size > len(usable) {
		return nil, fmt.Errorf("%d %s devices requested, %d usable", size, k.resource, len(usable))
	}
	if len(mustInclude) > size {
		return nil, fmt.Errorf("%d %s devices must be included in a set of %d", len(mustInclude), k.resource, size)
	}
	type gpuFree struct {
		index int
		used  int
		free  []devices.MIGInstance // usable, by placement
	}
	byGPU := map[string]*gpuFree{}
	for _, g := range k.model.GPUs() {
		used := 0
		for _, in := range g.MIG {
			if u.MIG[in.UUID] {
				used++
			}
		}
		byGPU[g.UUID] = &gpuFree{index: g.Index, used: used}
	}
	out := append([]string(nil), mustInclude...)
	for _, id := range mustInclude {
		g, _, ok := k.model.MIGInstanceOf(id)
		if !ok {
			return nil, fmt.Errorf("%s device %q: no such MIG instance on this node", k.resource, id)
		}
		byGPU[g.UUID].used++
	}
	for _, id := range usable {
		g, in, ok := k.model.MIGInstanceOf(id)
		if !ok {
			return nil, fmt.Errorf("%s device %q: no such MIG instance on this node", k.resource, id)
		}
		if !slices.Contains(mustInclude, id) {
			byGPU[g.UUID].free = append(byGPU[g.UUID].free, in)
		}
	}
	var gpus []*gpuFree
	for _, g := range byGPU {
		if len(g.free) > 0 {
			sort.Slice(g.free, func(i, j int) bool { return g.free[i].Start < g.free[j].Start })
			gpus = append(gpus, g)
		}
	}
	for len(out) < size && len(gpus) > 0 {
		missing := size - len(out)
		sort.Slice(gpus, func(i, j int) bool {
			a, b := gpus[i], gpus[j]
			fitA, fitB := len(a.free) >= missing, len(b.free) >= missing
			switch {
			case fitA != fitB:
				return fitA
			case !fitA && len(a.free) != len(b.free):
				return len(a.free) > len(b.free)
			case a.used != b.used:
				return a.used > b.used
			case len(a.free) != len(b.free):
				return len(a.free) < len(b.free)
			}
			return a.index < b.index
		})
		g := gpus[0]
		take := min(missing, len(g.free))
		for _, in := range g.free[:take] {
			out = append(out, in.UUID)
		}
		g.free, g.used = g.free[take:], g.used+take
		if len(g.free) == 0 {
			gpus = gpus[1:]
		}
	}
	if len(out) < size {
		return nil, fmt.Errorf("only %d of %d %s devices could be chosen", len(out), size, k.resource)
	}
	return out, nil
}

// Allocate checks every container's instances (of this profile, on this
// node, not twice, GPU healthy, not given to two containers) and answers
// with them.
func (k *migKind) Allocate(containers [][]string, h devices.HealthMap, _ devices.Usage) ([]*pluginapi.ContainerAllocateResponse, error) {
	var resps []*pluginapi.ContainerAllocateResponse
	taken := map[string]bool{}
	for _, ids := range containers {
		allocs, err := k.model.CheckMIG(k.resource, ids, h)
		if err != nil {
			return nil, err
		}
		uuids := make([]string, 0, len(allocs))
		for _, a := range allocs {
			if taken[a.Instance.UUID] {
				return nil, fmt.Errorf("MIG instance %s of GPU %d is requested for two containers", a.Instance.UUID, a.GPU.Index)
			}
			taken[a.Instance.UUID] = true
			uuids = append(uuids, a.Instance.UUID)
		}
		resps = append(resps, migResponse(k.cfg, k.resource, uuids))
	}
	return resps, nil
}

// ServedResources is the resources the agent serves on a node with gpus:
// the configuration's whole and shared resources, and the MIG resources.
// Without a tessera.dev/mig-* resource in the configuration, every MIG
// profile an instance of the node has (devices.MIGResources); with some,
// those of them the node has. The second result lists the configured MIG
// resources the node has no instance of.
func ServedResources(cfg *api.NodeAgentConfig, gpus []devices.GPU) (served, absent []corev1.ResourceName) {
	present := devices.MIGResources(gpus)
	var listed []corev1.ResourceName
	for _, r := range cfg.Resources {
		if api.IsMIGResource(r) {
			listed = append(listed, r)
			continue
		}
		served = append(served, r)
	}
	if len(listed) == 0 {
		return append(served, present...), nil
	}
	for _, r := range listed {
		if slices.Contains(present, r) {
			served = append(served, r)
		} else {
			absent = append(absent, r)
		}
	}
	return served, absent
}
