package devices

import (
	"fmt"
	"sort"

	corev1 "k8s.io/api/core/v1"

	"github.com/tessera-gpu/tessera/api"
)

// MIGInstance is one MIG instance of a GPU in MIG mode: a device of the
// resource api.MIGResource(Profile) whose ID is its MIG UUID.
type MIGInstance struct {
	UUID    string
	Profile string
	Start   int
	Size    int
}

// Served reports whether the instance's profile is one Tessera serves as a
// resource (api.ValidMIGProfile: not the +me, +gfx or c-sliced ones).
func (in MIGInstance) Served() bool { return api.ValidMIGProfile(in.Profile) }

// migRef locates a MIG instance in the model.
type migRef struct {
	gpu int // position in Model.gpus
	in  MIGInstance
}

// addMIG checks and indexes the MIG instances of the GPU at position p.
func (m *Model) addMIG(p int) error {
	g := m.gpus[p]
	if !g.MIGMode && len(g.MIG) > 0 {
		return fmt.Errorf("GPU %d (%s): MIG instances listed but MIG mode is off", g.Index, g.UUID)
	}
	g.MIG = append([]MIGInstance(nil), g.MIG...)
	m.gpus[p].MIG = g.MIG
	sort.Slice(g.MIG, func(i, j int) bool { return g.MIG[i].Start < g.MIG[j].Start })
	for _, in := range g.MIG {
		if !api.ValidMIGUUID(in.UUID) {
			return fmt.Errorf("GPU %d: MIG instance %q is not a MIG UUID like MIG-<hex>", g.Index, in.UUID)
		}
		if _, dup := m.migs[in.UUID]; dup {
			return fmt.Errorf("GPU %d: MIG instance %s is listed twice", g.Index, in.UUID)
		}
		if _, dup := m.byUUID[in.UUID]; dup {
			return fmt.Errorf("GPU %d: MIG instance %s has a GPU's UUID", g.Index, in.UUID)
		}
		m.migs[in.UUID] = migRef{gpu: p, in: in}
	}
	return nil
}

// migIDs are the device IDs of MIG resource r on GPU g: the UUIDs of its
// instances of r's profile, by placement.
func migIDs(r corev1.ResourceName, g GPU) []string {
	profile, ok := api.MIGProfileOf(r)
	if !ok || !g.MIGMode {
		return nil
	}
	ids := []string{}
	for _, in := range g.MIG {
		if in.Profile == profile {
			ids = append(ids, in.UUID)
		}
	}
	return ids
}

// MIGResources lists the MIG resources the GPUs' instances make, sorted:
// one per profile Tessera serves that some instance has.
func MIGResources(gpus []GPU) []corev1.ResourceName {
	seen := map[corev1.ResourceName]bool{}
	var out []corev1.ResourceName
	for _, g := range gpus {
		if !g.MIGMode {
			continue
		}
		for _, in := range g.MIG {
			r := api.MIGResource(in.Profile)
			if in.Served() && !seen[r] {
				seen[r] = true
				out = append(out, r)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// lookupMIG returns the GPU and instance of a device of MIG resource r.
func (m *Model) lookupMIG(r corev1.ResourceName, id string) (GPU, MIGInstance, error) {
	profile, ok := api.MIGProfileOf(r)
	if !ok {
		return GPU{}, MIGInstance{}, fmt.Errorf("%q is not a MIG resource", r)
	}
	ref, ok := m.migs[id]
	if !ok {
		return GPU{}, MIGInstance{}, fmt.Errorf("%s device %q: no such MIG instance on this node", r, id)
	}
	if ref.in.Profile != profile {
		return GPU{}, MIGInstance{}, fmt.Errorf("%s device %q: the MIG instance is a %s, not a %s", r, id, ref.in.Profile, profile)
	}
	return m.gpus[ref.gpu], ref.in, nil
}

// MIGInstanceOf returns the GPU and instance of a MIG UUID of this node.
func (m *Model) MIGInstanceOf(uuid string) (GPU, MIGInstance, bool) {
	ref, ok := m.migs[uuid]
	if !ok {
		return GPU{}, MIGInstance{}, false
	}
	return m.gpus[ref.gpu], ref.in, true
}

// MIGAllocation is one MIG instance of an Allocate request with its GPU.
type MIGAllocation struct {
	GPU      GPU
	Instance MIGInstance
}

// CheckMIG checks an Allocate request for MIG resource r: every device is
// an instance of r's profile on this node, none is listed twice, and its
// GPU is healthy. It returns them by GPU index and placement.
func (m *Model) CheckMIG(r corev1.ResourceName, ids []string, health HealthMap) ([]MIGAllocation, error) {
	if !m.enabled(r) {
		return nil, fmt.Errorf("resource %s is not advertised on this node", r)
	}
	if len(ids) == 0 {
		return nil, fmt.Errorf("no %s devices requested", r)
	}
	seen := map[string]bool{}
	var out []MIGAllocation
	for _, id := range ids {
		g, in, err := m.lookupMIG(r, id)
		if err != nil {
			return nil, err
		}
		if seen[id] {
			return nil, fmt.Errorf("%s device %q is requested twice", r, id)
		}
		seen[id] = true
		if h := health.Of(g.UUID); !h.Healthy {
			return nil, fmt.Errorf("MIG instance %s of GPU %d (%s) is unhealthy: %s", id, g.Index, g.UUID, h.Reason)
		}
		out = append(out, MIGAllocation{GPU: g, Instance: in})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].GPU.Index != out[j].GPU.Index {
			return out[i].GPU.Index < out[j].GPU.Index
		}
		return out[i].Instance.Start < out[j].Instance.Start
	})
	return out, nil
}
