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

// Preferred implements PreferredAllocator: mustInclude, then instances of
// the GPUs with the most instances in use (any profile), then of the GPUs
// with the fewest free instances, by GPU index and placement; GPUs whose
// instances are all free stay free as long as possible.
func (k *migKind) Preferred(usable, mustInclude []string, size int, u devices.Usage) ([]string, error) {
	if size > len(usable) {
		return nil, fmt.Errorf("%d %s devices requested, %d usable", size, k.resource, len(usable))
	}
	if len(mustInclude) > size {
		return nil, fmt.Errorf("%d %s devices must be included in a set of %d", len(mustInclude), k.resource, size)
	}
	type cand struct {
		id          string
		gpu, start  int
		used, avail int
	}
	// used and avail per GPU: instances in use (of any profile) and
	// usable instances of this profile.
	used, avail := map[string]int{}, map[string]int{}
	for _, g := range k.model.GPUs() {
		for _, in := range g.MIG {
			if u.MIG[in.UUID] {
				used[g.UUID]++
			}
		}
	}
	var cands []cand
	for _, id := range usable {
		g, in, ok := k.model.MIGInstanceOf(id)
		if !ok {
			return nil, fmt.Errorf("%s device %q: no such MIG instance on this node", k.resource, id)
		}
		avail[g.UUID]++
		cands = append(cands, cand{id: id, gpu: g.Index, start: in.Start, used: used[g.UUID]})
	}
	for i := range cands {
		g, _, _ := k.model.MIGInstanceOf(cands[i].id)
		cands[i].avail = avail[g.UUID]
	}
	sort.Slice(cands, func(i, j int) bool {
		a, b := cands[i], cands[j]
		switch {
		case a.used != b.used:
			return a.used > b.used
		case a.avail != b.avail:
			return a.avail < b.avail
		case a.gpu != b.gpu:
			return a.gpu < b.gpu
		}
		return a.start < b.start
	})
	out := append([]string(nil), mustInclude...)
	for _, c := range cands {
		if len(out) == size {
			break
		}
		if !slices.Contains(out, c.id) {
			out = append(out, c.id)
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
