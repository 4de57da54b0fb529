package preferred

import (
	"cmp"
	"slices"
	"sort"

	corev1 "k8s.io/api/core/v1"

	"github.com/tessera-gpu/tessera/deviceplugin/devices"
)

// The kubelet's GetPreferredAllocation names no pod: for shared units the
// agent has to tell which slice it is for, so that the units it prefers
// are those of the GPU the extender assigned that slice (a unit counts, in
// the kubelet's books, on the GPU its ID names). What it knows:
//
//   - The kubelet admits pods one at a time (Kubelet.HandlePodAdditions,
//     pkg/kubelet/kubelet.go: a batch sorted by creation timestamp, each
//     pod added to its pod manager just before it is admitted), and
//     admission allocates the devices of every container of the pod in
//     turn, init containers first, then the others
//     (devicemanager.ManagerImpl.Allocate). So at a call, the pods the
//     kubelet lists (PodResources List: its pod manager's active pods) are
//     those admitted before, which hold their devices, and the one being
//     admitted, which lacks some.
//   - The kubelet's allocations, read at the call, say which containers
//     hold units of which resource already: PodResources by pod name
//     (except init containers that are not restartable), the device
//     manager's checkpoint by pod UID.
//   - The call's size is the container's whole request of the resource.

// PodKey names a pod of the kubelet's list.
type PodKey struct{ Namespace, Name string }

// AllocKey names the devices of one resource the kubelet allocated to one
// container: by pod name (PodResources) or by pod UID (the checkpoint).
type AllocKey struct {
	Namespace, Name, UID, Container string
	Resource                        corev1.ResourceName
}

// KubeletView is what the kubelet's allocations said at the call.
type KubeletView struct {
	// Listed are the pods the kubelet lists; nil when its source lists
	// none (the checkpoint): then every pod may be the one it admits.
	Listed map[PodKey]bool
	// Allocated are the containers holding devices, per resource.
	Allocated map[AllocKey]bool
}

func (k KubeletView) allocated(p *devices.SlicePod, container string, r corev1.ResourceName) bool {
	return k.Allocated[AllocKey{Namespace: p.Namespace, Name: p.Name, Container: container, Resource: r}] ||
		p.UID != "" && k.Allocated[AllocKey{UID: p.UID, Container: container, Resource: r}]
}

// laterAllocated: some container of p that is not an init container holds
// devices of a shared resource.
func (k KubeletView) laterAllocated(p *devices.SlicePod) bool {
	for _, c := range p.Containers {
		if c.Init {
			continue
		}
		for r := range c.Units {
			if k.allocated(p, c.Name, r) {
				return true
			}
		}
	}
	return false
}

// Admission is the slice container whose units of a resource the kubelet
// is taken to allocate now.
type Admission struct {
	Namespace, Name, Container string
	// GPUs are those its assignment names, in index order.
	GPUs []string
}

// Admitting returns the slice container whose size units of r the kubelet
// is taken to allocate now, among pods (the node's unstarted slices), and
// false when none fits. A pod is a candidate when the kubelet lists it
// (when its source lists pods) and one of its containers asks for size
// units of r and holds none yet (the first such, in the kubelet's order;
// an init container that is not restartable is taken to hold its units
// once a later container holds some: they passed on); the oldest
// candidate wins (creation timestamp, then namespace and name: the
// kubelet's order within a batch, ties resolved the only way the agent
// can). A winner whose assignment names no GPU for that container (it was
// dropped by the trust filter) is no answer: false.
func Admitting(r corev1.ResourceName, size int, pods []devices.SlicePod, k KubeletView) (Admission, bool) {
	order := make([]*devices.SlicePod, len(pods))
	for i := range pods {
		order[i] = &pods[i]
	}
	sort.SliceStable(order, func(i, j int) bool {
		a, b := order[i], order[j]
		if !a.Created.Equal(b.Created) {
			return a.Created.Before(b.Created)
		}
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name)) < 0
	})
	for _, p := range order {
		if k.Listed != nil && !k.Listed[PodKey{p.Namespace, p.Name}] {
			continue
		}
		c, ok := pendingContainer(p, r, size, k)
		if !ok {
			continue
		}
		if len(c.GPUs) == 0 {
			return Admission{}, false
		}
		return Admission{Namespace: p.Namespace, Name: p.Name, Container: c.Name, GPUs: slices.Clone(c.GPUs)}, true
	}
	return Admission{}, false
}

// pendingContainer is p's first container, in the kubelet's order, that
// asks for size units of r and is not known to hold any. The first
// container that holds none is the one the kubelet is at, but the
// PodResources API does not list init containers that are not restartable:
// one whose units were allocated looks pending until a later container
// holds units.
func pendingContainer(p *devices.SlicePod, r corev1.ResourceName, size int, k KubeletView) (devices.SliceContainer, bool) {
	later := k.laterAllocated(p)
	for _, c := range p.Containers {
		if c.Units[r] != int64(size) || k.allocated(p, c.Name, r) || c.Init && later {
			continue
		}
		return c, true
	}
	return devices.SliceContainer{}, false
}

// UnitsOn is Units for the slice whose GPUs are target (Admitting): a
// slice of one GPU takes that GPU's units before any other's (it ranks
// above all of rank); a multi-GPU slice takes size/len(target) units of
// each of its GPUs, as the extender counts it, when it asks for a multiple
// of its GPU count, names no must-include units and each of its GPUs has
// that many available; otherwise its GPUs rank first together and Units
// packs as usual.
func UnitsOn(r corev1.ResourceName, available, mustInclude []string, size int, target []string, rank map[string]int) ([]string, error) {
	if len(target) > 1 && len(mustInclude) == 0 && size > 0 && size%len(target) == 0 {
		if ids, ok := spread(r, available, size/len(target), target); ok {
			return ids, nil
		}
	}
	top := 0
	for _, v := range rank {
		top = max(top, v)
	}
	ranked := make(map[string]int, len(rank)+len(target))
	for uuid, v := range rank {
		ranked[uuid] = v
	}
	for _, uuid := range target {
		ranked[uuid] = top + 1
	}
	return Units(r, available, mustInclude, size, ranked)
}

// spread takes per units of each GPU of target out of available, the
// lowest-numbered first; false when one has fewer or an ID is malformed
// (Units then reports it).
func spread(r corev1.ResourceName, available []string, per int, target []string) ([]string, bool) {
	type unit struct {
		id string
		n  int
	}
	free := map[string][]unit{}
	seen := map[string]bool{}
	for _, id := range available {
		uuid, n, err := devices.ParseDeviceID(r, id)
		if err != nil {
			return nil, false
		}
		if !seen[id] {
			seen[id] = true
			free[uuid] = append(free[uuid], unit{id, n})
		}
	}
	var out []string
	done := map[string]bool{}
	for _, uuid := range target {
		if done[uuid] {
			return nil, false
		}
		done[uuid] = true
		us := free[uuid]
		if len(us) < per {
			return nil, false
		}
		sort.Slice(us, func(i, j int) bool { return us[i].n < us[j].n })
		for _, u := range us[:per] {
			out = append(out, u.id)
		}
	}
	return out, true
}
